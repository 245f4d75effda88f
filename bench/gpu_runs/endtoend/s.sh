#!/usr/bin/env bash
# Call S (one GPU): the GPU tests on the build that prepares the right side while the context comes
# up, then `knn` Parquet -> Parquet against `bench` (the operator) on the movielens shape, with a
# debug timeline (issue 14 item 5).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/w; mkdir -p $W
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$W/device.txt"
for f in devbin/*/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
L=$W/log.txt
pack() { tar -C /tmp -czf $OUT/s.tgz w; }
timeout 150 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -16 | tee $W/gpu_test.log
pack
timeout 120 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | tail -8 | tee $W/gpu_sql_test.log
pack
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
ms() { echo $(( $(date +%s%N) / 1000000 )); }
bench() { RUST_LOG=datafusion_sparse_knn=info timeout 100 /tmp/sparse-knn bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "run [0-9]|^gpu|^metric" | tee -a $L; }
bench
for round in 1 2 3; do
  for metric in cosine manhattan; do
    s=$(ms)
    /tmp/sparse-knn knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >/dev/null 2>>$L
    e=$(ms)
    echo "knn metric=$metric round=$round wall_ms=$((e - s))" | tee -a $L
  done
done
bench
pack
for metric in cosine manhattan; do
  echo "process start $(date -u +%H:%M:%S.%N)" > $W/timeline_$metric.txt
  RUST_LOG=datafusion_sparse_knn=debug /tmp/sparse-knn knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >> $W/timeline_$metric.txt 2>&1
  echo "process end $(date -u +%H:%M:%S.%N)" >> $W/timeline_$metric.txt
done
pack
