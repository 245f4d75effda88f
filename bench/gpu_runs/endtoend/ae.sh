#!/usr/bin/env bash
# Call AE (two GPUs, 2026-11-25; issue 11's last item): the multi-GPU tests, then bench on the
# movielens shape (full size) on one GPU and on both in the same run, cosine and manhattan,
# two rounds, best of 3 each (the right side whole on each GPU, the left rows split).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
timeout 150 /tmp/gpu_test --ignored --test-threads=1 every_gpu_of_the_host replicas_split 2>&1 | grep -E "^test |test result|panicked" | tee $W/gpu_test.log
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2; do for vis in 0 0,1; do
  echo "bench visible=$vis round=$round" | tee -a $W/log.txt
  CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
CUDA_VISIBLE_DEVICES=0,1 RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 1 > $W/bench_2gpu_debug.log 2>&1
