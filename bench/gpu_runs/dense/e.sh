#!/usr/bin/env bash
# Call E (one GPU, the call-D binaries): issue 14 item 0, cosine against cuSPARSE on the same
# generated files at the paper's full sizes (movielens, nytimes, secedgar; scrna was call D):
# our full self-join (bench, best of 2) and anchors.py's projection of 1,024 queries.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in devbin/new/sparse-knn.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/summary.txt
for s in movielens nytimes secedgar; do
  /tmp/sparse-knn generate --shape $s --seed 0 --output /tmp/$s.parquet 2>&1 | tail -1 | tee -a $OUT/summary.txt
  timeout 90 /tmp/sparse-knn bench --input /tmp/$s.parquet --metrics cosine --devices gpu -k 10 --repeat 2 --json $OUT/$s.json --overwrite 2>&1 | grep "^gpu" | tee -a $OUT/summary.txt
  PYTHONUNBUFFERED=1 OUT=/tmp timeout 150 python3 devbin/anchors.py --parquet $s=/tmp/$s.parquet 2>&1 | grep -E "cusparse|batch|torch" | tee -a $OUT/summary.txt
done
