#!/usr/bin/env bash
# Call AF (two GPUs, 2026-11-25; issue 11's 2-GPU figure): a probe goes whole to the GPU with
# the least work queued (cut only where each idle GPU gets 8,192 rows or more). The multi-GPU
# tests, then bench on the movielens shape (full size), cosine and manhattan, best of 3, on one
# GPU, on two (replicated, the default) and on two with the right side sharded
# (SPARSE_KNN_GPU_SHARD=1), two rounds; then one debug timeline of each for where the time goes.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
nproc | tee -a "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
timeout 150 /tmp/gpu_test --ignored --test-threads=1 every_gpu_of_the_host replicas_split 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2; do for mode in 0 0,1 shard; do
  vis=$mode; shard=0; [ $mode = shard ] && { vis=0,1; shard=1; }
  echo "bench visible=$vis shard=$shard round=$round" | tee -a $W/log.txt
  SPARSE_KNN_GPU_SHARD=$shard CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
for mode in 0 0,1 shard; do
  vis=$mode; shard=0; [ $mode = shard ] && { vis=0,1; shard=1; }
  SPARSE_KNN_GPU_SHARD=$shard CUDA_VISIBLE_DEVICES=$vis RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 3 > $W/debug_$mode.log 2>&1
done
echo done | tee -a $W/log.txt
