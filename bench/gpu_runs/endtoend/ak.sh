#!/usr/bin/env bash
# Call AK (two GPUs, 2026-11-25): the final tree of the session (the lanes made in one place at
# the device's opening, each GPU's rayon pool only with several GPUs): every GPU test and GPU SQL
# test on both GPUs, then bench on movielens (full size), cosine and manhattan, one GPU and two.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for vis in 0 0,1; do
  echo "bench movielens visible=$vis" | tee -a $W/log.txt
  CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
timeout 100 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_sql_test.log
echo done | tee -a $W/log.txt
