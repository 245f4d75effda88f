#!/usr/bin/env bash
# Call AR (one GPU, 2026-11-26): where the segment map pays (same binary as call AQ): bench,
# cosine on movielens (and manhattan), nytimes and secedgar, with the search only
# (SPARSE_KNN_GPU_SEG_MAP_MIN=4294967295), the map from 513 work items a chunk (more than one
# round of the block: call AQ's default) and from 2,048 (one full window), alternated, 2 rounds.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
for f in devbin/e2e/sk_new.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /tmp/data
for s in movielens nytimes secedgar; do /tmp/sk_new generate --shape $s --output /tmp/data/$s.parquet 2>&1 | tail -1 | tee -a $W/log.txt; done
for round in 1 2; do for s in movielens nytimes secedgar; do
  m=cosine; [ $s = movielens ] && m=cosine,manhattan
  for min in 4294967295 513 2048; do
    echo "bench $s seg_map_min=$min round=$round" | tee -a $W/log.txt
    SPARSE_KNN_GPU_SEG_MAP_MIN=$min timeout 100 /tmp/sk_new bench --input /tmp/data/$s.parquet --metrics $m --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|rror" | tee -a $W/log.txt
  done
done; done
echo done | tee -a $W/log.txt
