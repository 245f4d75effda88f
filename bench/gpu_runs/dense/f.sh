#!/usr/bin/env bash
# Call F (one GPU): the final build (the TF32 split as one helper, the GPU tests' radius check as
# one helper, replicas only across GPUs of one tensor-core kind): every GPU test, the SQL GPU
# tests, and scrna cosine once more with the anchors' torch figure.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in devbin/new/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/summary.txt
timeout 200 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee -a $OUT/summary.txt
timeout 100 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee -a $OUT/summary.txt
/tmp/sparse-knn generate --shape scrna --seed 0 --output /tmp/scrna.parquet --overwrite 2>&1 | tail -1 | tee -a $OUT/summary.txt
timeout 60 /tmp/sparse-knn bench --input /tmp/scrna.parquet --metrics cosine --devices gpu -k 10 --repeat 3 --json $OUT/scrna.json --overwrite 2>&1 | grep "^gpu" | tee -a $OUT/summary.txt
