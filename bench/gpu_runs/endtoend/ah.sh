#!/usr/bin/env bash
# Call AH (two GPUs, 2026-11-25; issue 11's 2-GPU figure): probes on two lanes (streams) per
# GPU, so one probe's host steps and copies overlap another's kernels; the right side sharded
# over the GPUs by default (rows >= 16,384 a GPU). Every GPU test on both GPUs, then bench on
# movielens (full size), cosine and manhattan, best of 3: one GPU and two, each with one lane
# (SPARSE_KNN_GPU_LANES=1, the old probe path) and two (the default), two rounds.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
nproc | tee -a "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2; do for mode in one1 one2 two1 two2; do
  vis=0,1; [ ${mode:0:3} = one ] && vis=0; lanes=${mode:3:1}
  echo "bench movielens visible=$vis lanes=$lanes round=$round" | tee -a $W/log.txt
  SPARSE_KNN_GPU_LANES=$lanes CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
CUDA_VISIBLE_DEVICES=0,1 RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 3 > $W/debug_two2.log 2>&1
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
timeout 120 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_sql_test.log
echo done | tee -a $W/log.txt
