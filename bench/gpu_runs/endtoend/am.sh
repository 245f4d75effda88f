#!/usr/bin/env bash
# Call AM (two GPUs, 2026-11-25, new session): the previous session's last tree (pinned staging,
# the device's context bound while it drops, Lanes::sharing_budget) checked on both GPUs: bench on
# movielens, one GPU and two, alternated, a debug timeline of a two-GPU run, knn Parquet ->
# Parquet, then every GPU test and GPU SQL test.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2; do for vis in 0 0,1; do
  echo "bench movielens visible=$vis round=$round" | tee -a $W/log.txt
  CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
RUST_LOG=datafusion_sparse_knn::gpu=debug timeout 60 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 2 > $W/debug_two.log 2>&1
for vis in 0 0,1; do for m in cosine manhattan; do
  s=$(date +%s.%N); CUDA_VISIBLE_DEVICES=$vis timeout 60 /tmp/sk_new knn --left $f --right $f --metric $m -k 10 --device gpu --output /tmp/data/out.parquet --overwrite > /dev/null 2>>$W/knn.err; e=$(date +%s.%N)
  echo "knn visible=$vis $m wall $(echo "$e - $s" | bc)" | tee -a $W/log.txt
done; done
timeout 100 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_sql_test.log
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
echo done | tee -a $W/log.txt
