#!/usr/bin/env bash
# Call AC (one GPU, 2026-11-25): the build whose dense-column choice counts in one plain pass.
# The GPU tests (gpu, gpu_sql), then the layout's time in knn's timeline at the movielens shape
# (cosine) and on a 20,000-row scrna cut, where the choice takes columns.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
timeout 200 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee $W/gpu_test.log
timeout 150 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee $W/gpu_sql_test.log
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet; sc=/tmp/data/scrna20k.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
/tmp/sk_new generate --shape scrna --rows 20000 --output $sc 2>&1 | tail -1 | tee -a $W/log.txt
timeout 100 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
for r in 1 2; do for input in $f $sc; do
  echo "== knn cosine $input round $r" >> $W/timelines.txt
  RUST_LOG=datafusion_sparse_knn=debug /tmp/sk_new knn --left $input --right $input --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite 2>&1 | grep -E "read the right|dense columns|laid out|built the right|^knn:" | sed 's/.*DEBUG //' | tee -a $W/timelines.txt
done; done
