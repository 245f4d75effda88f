#!/usr/bin/env bash
# Call AG (two GPUs, 2026-11-25; issue 11's 2-GPU figure): as AF, with each GPU's shards laid
# out on its own share of the host's cores and, whole on each GPU, probes of equal loads taking
# the GPUs in turn. Movielens (full size), cosine and manhattan, best of 3, on one GPU, on two
# with the right side whole on each (replicated) and on two with it sharded
# (SPARSE_KNN_GPU_SHARD=1), two rounds; then the other paper shapes, cosine, best of 2, the same
# three ways (which of replicated and sharded to pick by size); debug timelines last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
nproc | tee -a "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
timeout 150 /tmp/gpu_test --ignored --test-threads=1 every_gpu_of_the_host replicas_split 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
mkdir -p /tmp/data
run3() { # shape metrics repeat
  local f=/tmp/data/$1.parquet
  for mode in one two shard; do
    vis=0,1; shard=0; [ $mode = one ] && vis=0; [ $mode = shard ] && shard=1
    echo "bench $1 mode=$mode" | tee -a $W/log.txt
    SPARSE_KNN_GPU_SHARD=$shard CUDA_VISIBLE_DEVICES=$vis timeout 120 /tmp/sk_new bench --input $f --metrics $2 --devices gpu -k 10 --repeat $3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
  done
}
/tmp/sk_new generate --shape movielens --output /tmp/data/movielens.parquet 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2; do run3 movielens cosine,manhattan 3; done
for shape in scrna nytimes secedgar; do
  /tmp/sk_new generate --shape $shape --output /tmp/data/$shape.parquet 2>&1 | tail -1 | tee -a $W/log.txt
  run3 $shape cosine 2
done
for mode in one two shard; do
  vis=0,1; shard=0; [ $mode = one ] && vis=0; [ $mode = shard ] && shard=1
  SPARSE_KNN_GPU_SHARD=$shard CUDA_VISIBLE_DEVICES=$vis RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_new bench --input /tmp/data/movielens.parquet --metrics cosine --devices gpu -k 10 --repeat 3 > $W/debug_$mode.log 2>&1
done
echo done | tee -a $W/log.txt
