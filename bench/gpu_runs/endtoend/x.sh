#!/usr/bin/env bash
# Call X (one GPU, 2026-11-25; issue 14 item 5): the GPU tests on the build that compiles the
# kernels beside the context's creation and closes the GPU while `knn` finishes its output; then
# `knn` Parquet -> Parquet against `bench` (the operator) on the movielens shape, old binary
# (call A's build, 200c20a's code) and new alternated, with debug timelines of both.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
L=$W/log.txt
timeout 200 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee $W/gpu_test.log
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
ms() { echo $(( $(date +%s%N) / 1000000 )); }
bench() { timeout 100 /tmp/$1 bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "run [0-9]|^gpu|^metric" | sed "s/^/$1 /" | tee -a $L; }
bench sk_new
bench sk_old
for round in 1 2 3; do
  for metric in cosine manhattan; do
    for b in sk_old sk_new; do
      s=$(ms)
      /tmp/$b knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >/dev/null 2>>$L
      e=$(ms)
      echo "knn $b metric=$metric round=$round wall_ms=$((e - s))" | tee -a $L
    done
  done
done
bench sk_new
for b in sk_old sk_new; do for metric in cosine manhattan; do
  t=$W/timeline_${b}_$metric.txt
  echo "process start $(date -u +%H:%M:%S.%N)" > $t
  RUST_LOG=datafusion_sparse_knn=debug /tmp/$b knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >> $t 2>&1
  echo "process end $(date -u +%H:%M:%S.%N)" >> $t
done; done
