#!/usr/bin/env bash
# Call G (one GPU): rows of sum 0 finished only where they can be selected (dot, cosine). Every
# GPU test on the new build, then old (call F's build) and new alternated on the four paper
# shapes, cosine, full self-join, and a cosine radius_join (radius 0.5) on secedgar.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for v in old new; do mkdir -p /tmp/$v; for f in devbin/$v/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$v/$b && chmod +x /tmp/$v/$b; done; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/summary.txt
timeout 200 /tmp/new/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee -a $OUT/summary.txt
for s in secedgar movielens nytimes scrna; do
  /tmp/new/sparse-knn generate --shape $s --seed 0 --output /tmp/$s.parquet --overwrite 2>&1 | tail -1 | tee -a $OUT/summary.txt
  for v in old new old new; do
    echo "$s $v $(timeout 60 /tmp/$v/sparse-knn bench --input /tmp/$s.parquet --metrics cosine --devices gpu -k 10 --repeat 1 2>&1 | grep '^gpu' | cut -c1-90)" | tee -a $OUT/summary.txt
  done
done
for v in old new; do
  /usr/bin/time -f "$v radius secedgar %e s" timeout 60 /tmp/$v/sparse-knn sql -c "SELECT count(*) AS pairs, sum(distance) AS total FROM radius_join('/tmp/secedgar.parquet', '/tmp/secedgar.parquet', 'cosine', 0.5, 'device=gpu')" 2>&1 | tail -4 | tee -a $OUT/summary.txt
done
