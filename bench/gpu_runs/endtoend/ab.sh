#!/usr/bin/env bash
# Call AB (one GPU, 2026-11-25): the build where the inputs read whole are always gathered in
# order and read with file-scan work stealing off. The GPU tests (gpu, gpu_sql), ties on a
# Parquet file of 20 row groups whose first is slow to decode (dot with a row that ties with every
# row: the first five rows must come back), then knn against bench on the movielens shape with
# timelines (the right side's read without work stealing).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
timeout 200 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee $W/gpu_test.log
timeout 150 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee $W/gpu_sql_test.log
for dev in gpu cpu; do for p in 2 16; do for r in 1 2; do
  echo "ties device=$dev partitions=$p round=$r: $(/tmp/sk_new sql -c "SET datafusion.execution.target_partitions = $p; SELECT neighbor_id FROM knn_join('devbin/e2e/ties_left.parquet', 'devbin/e2e/ties2.parquet', 'dot', 5, 'device=$dev') WHERE query_id = 0 ORDER BY rank" 2>&1 | tr -d ' |' | grep -v '^+' | tr '\n' ' ')" | tee -a $W/ties.log
done; done; done
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
ms() { echo $(( $(date +%s%N) / 1000000 )); }
for r in 1 2 3; do for metric in cosine manhattan; do
  s=$(ms); /tmp/sk_new knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite > /dev/null 2>&1; e=$(ms)
  echo "knn metric=$metric round=$r wall_ms=$((e - s))" | tee -a $W/log.txt
done; done
t=$W/timeline_knn_cosine.txt
echo "process start $(date -u +%H:%M:%S.%N)" > $t
RUST_LOG=datafusion_sparse_knn=debug /tmp/sk_new knn --left $f --right $f --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >> $t 2>&1
echo "process end $(date -u +%H:%M:%S.%N)" >> $t
