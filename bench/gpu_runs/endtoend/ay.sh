#!/usr/bin/env bash
# Call AY (one GPU, 2026-11-26): the warning when the CUDA compile cache has nowhere to keep the
# kernels: a 2,000-row knn with the cache as it is (twice: the second finds the kernels), with
# CUDA_CACHE_DISABLE=1, and without HOME; stderr of each.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
xz -T4 -dc devbin/e2e/sk_new.xz > /tmp/sk_new && chmod +x /tmp/sk_new
/tmp/sk_new generate --shape nytimes --rows 2000 --output /tmp/small.parquet 2>&1 | tail -1
TIMEFORMAT='wall %R s'
run() { echo "== $1"; shift; time "$@" /tmp/sk_new knn --left /tmp/small.parquet --right /tmp/small.parquet --metric cosine -k 5 --device gpu --output /tmp/o.parquet --overwrite 2>&1; }
{ run "cache as it is (first)" env
  run "cache as it is (second)" env
  run "CUDA_CACHE_DISABLE=1" env CUDA_CACHE_DISABLE=1
  run "no HOME" env -u HOME
  run "no HOME, CUDA_CACHE_PATH=/tmp/cc" env -u HOME CUDA_CACHE_PATH=/tmp/cc
  run "no HOME, CUDA_CACHE_PATH=/tmp/cc (second)" env -u HOME CUDA_CACHE_PATH=/tmp/cc
} 2>&1 | tee $W/log.txt
