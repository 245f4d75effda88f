#!/usr/bin/env bash
# Call AJ (two GPUs, 2026-11-25; issue 11's 2-GPU figure, confirmation): the binary of call AI
# (commit f0d0fc6), bench on movielens (full size), cosine and manhattan, best of 3, one GPU and
# two alternated, three rounds.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
nproc | tee -a "$W/device.txt"
xz -dc devbin/e2e/sk_new.xz > /tmp/sk_new && chmod +x /tmp/sk_new
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2 3; do for vis in 0 0,1; do
  echo "bench movielens visible=$vis round=$round" | tee -a $W/log.txt
  CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
echo done | tee -a $W/log.txt
