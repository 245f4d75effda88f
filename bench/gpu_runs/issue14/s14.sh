#!/usr/bin/env bash
# One device call: GPU tests, end to end old vs new, certified metrics old vs new.
set -u
cd "$(dirname "$0")/.."
for b in sparse-knn sparse-knn-old gpu_test; do xz -dc devrun/$b.xz > /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
/tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -30 > $OUT/gpu_test.log
grep "test result" $OUT/gpu_test.log
mkdir -p /tmp/data
f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee $OUT/e2e.log
for metric in cosine manhattan; do
  /tmp/sparse-knn bench --input $f --metrics $metric --devices gpu -k 10 --repeat 2 2>&1 | grep "^gpu" | sed "s/^/bench $metric /" | tee -a $OUT/e2e.log
  for round in 1 2 3; do for b in sparse-knn-old sparse-knn; do
    s=$(date +%s%N); /tmp/$b knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >/dev/null 2>&1; e=$(date +%s%N)
    echo "knn $b metric=$metric round=$round wall_ms=$(( (e - s) / 1000000 ))" | tee -a $OUT/e2e.log
  done; done
done
g=/tmp/data/ml100k.parquet
/tmp/sparse-knn generate --shape movielens --rows 100000 --output $g >/dev/null 2>&1
for round in 1 2; do for b in sparse-knn-old sparse-knn; do
  timeout 120 /tmp/$b bench --input $g --metrics cosine,minkowski,hellinger --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu" | sed "s/^/$b r$round /" | tee -a $OUT/cert.log
done; done
