#!/usr/bin/env bash
# Call AL (one GPU, 2026-11-25): large uploads through two pinned staging buffers per lane.
# GPU tests with every upload of 4 KB or more staged in 4 KB pieces (SPARSE_KNN_STAGE_BYTES=4096),
# then bench, one GPU, staging off (SPARSE_KNN_STAGE_BYTES=10^12: no upload reaches it) and on
# (the default, 8 MiB), movielens (cosine, manhattan, best of 3, two rounds) and scrna (cosine).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
SPARSE_KNN_STAGE_BYTES=4096 timeout 120 /tmp/gpu_test --ignored --test-threads=1 every_metric_matches_cpu_small every_metric_matches_cpu_many_tiles dense_columns_on_tensor_cores every_metric_matches_cpu_under_memory_limit one_index_probed radius_matches_cpu 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test_staged.log
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2; do for stage in 1000000000000 8388608; do
  echo "bench movielens stage_bytes=$stage round=$round" | tee -a $W/log.txt
  SPARSE_KNN_STAGE_BYTES=$stage timeout 60 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
/tmp/sk_new generate --shape scrna --output /tmp/data/scrna.parquet 2>&1 | tail -1 | tee -a $W/log.txt
for stage in 1000000000000 8388608; do
  echo "bench scrna stage_bytes=$stage" | tee -a $W/log.txt
  SPARSE_KNN_STAGE_BYTES=$stage timeout 60 /tmp/sk_new bench --input /tmp/data/scrna.parquet --metrics cosine --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done
echo done | tee -a $W/log.txt
