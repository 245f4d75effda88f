#!/usr/bin/env bash
# Call AT (two GPUs, 2026-11-26): each column's tile boundaries found in one pass beside the
# tiles (a binary search per tile only for columns longer than 8 entries a tile). Bench on
# movielens, one GPU and two, three rounds alternated; a debug timeline of each.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
xz -T4 -dc devbin/e2e/sk_new.xz > /tmp/sk_new && chmod +x /tmp/sk_new
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2 3; do for vis in 0 0,1; do
  echo "bench movielens visible=$vis round=$round" | tee -a $W/log.txt
  CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
for vis in 0 0,1; do
  RUST_LOG=datafusion_sparse_knn=debug CUDA_VISIBLE_DEVICES=$vis timeout 60 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 2 2>&1 | grep -E "GPU index|built the right|read the right|^gpu" > $W/debug_gpus_${vis/,/_}.log
done
echo done | tee -a $W/log.txt
