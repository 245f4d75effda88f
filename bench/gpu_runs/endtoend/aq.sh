#!/usr/bin/env bash
# Call AQ (one GPU, 2026-11-26): the folded kernels' segment map (each work item's segment from a
# block-wide max-scan of the segments' first items, where a binary search over the segments
# took ~9 shared-memory steps). Every GPU test with the map on every chunk
# (SPARSE_KNN_GPU_SEG_MAP_MIN=1); then bench, cosine at the four paper shapes (and manhattan on
# movielens), the search only (SPARSE_KNN_GPU_SEG_MAP_MIN=4294967295, the old kernels but for
# 4 KB more shared memory) against the default, alternated, same binary.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /tmp/data
SPARSE_KNN_GPU_SEG_MAP_MIN=1 timeout 200 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test_map_everywhere.log
for s in movielens nytimes secedgar scrna; do /tmp/sk_new generate --shape $s --output /tmp/data/$s.parquet 2>&1 | tail -1 | tee -a $W/log.txt; done
for s in movielens nytimes secedgar scrna; do
  m=cosine; [ $s = movielens ] && m=cosine,manhattan
  for min in 4294967295 default 4294967295 default; do
    echo "bench $s seg_map_min=$min" | tee -a $W/log.txt
    if [ $min = default ]; then e=""; else e="SPARSE_KNN_GPU_SEG_MAP_MIN=$min"; fi
    env $e timeout 100 /tmp/sk_new bench --input /tmp/data/$s.parquet --metrics $m --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric|rror" | tee -a $W/log.txt
  done
done
echo done | tee -a $W/log.txt
