#!/usr/bin/env bash
# Call AA (one GPU, 2026-11-25; issue 14 item 5): the GPU tests with the new
# closed_gpus_reopen_for_the_next_join, then debug timelines of knn (cosine, manhattan; the build
# now logs its wait for the device and the layout's time) and of a 100-row knn (the fixed costs).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee $W/gpu_test.log
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet; s100=/tmp/data/small.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
/tmp/sk_new generate --shape movielens --rows 100 --seed 3 --output $s100 > /dev/null 2>&1
timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
tl() { t=$W/timeline_$1.txt; shift; echo "process start $(date -u +%H:%M:%S.%N)" > $t; RUST_LOG=datafusion_sparse_knn=debug "$@" >> $t 2>&1; echo "process end $(date -u +%H:%M:%S.%N)" >> $t; }
for r in 1 2; do
  tl knn_cosine_$r /tmp/sk_new knn --left $f --right $f --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite
  tl knn_manhattan_$r /tmp/sk_new knn --left $f --right $f --metric manhattan -k 10 --device gpu --output /tmp/data/out.parquet --overwrite
  tl knn100_$r /tmp/sk_new knn --left $s100 --right $s100 --metric cosine -k 10 --device gpu --output /tmp/data/o2.parquet --overwrite
done
