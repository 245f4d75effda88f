#!/usr/bin/env bash
# Call M (final build): the SQL GPU tests, then end to end (item 5): `bench` best of 3 against
# `knn` Parquet -> Parquet in fresh processes, cosine and manhattan, and chebyshev's `knn`.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/w; mkdir -p $W
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$W/device.txt"
for f in devbin/*/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
L=$W/log.txt
pack() { tar -C /tmp -czf $OUT/m.tgz w; }
timeout 150 /tmp/gpu_sql_test --include-ignored --test-threads=1 2>&1 | tail -10 | tee $W/gpu_sql_test.log
pack
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
RUST_LOG=datafusion_sparse_knn=info timeout 100 /tmp/sparse-knn bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "run [0-9]|^gpu|^metric" | tee -a $L
ms() { echo $(( $(date +%s%N) / 1000000 )); }
for round in 1 2 3; do
  for metric in cosine manhattan chebyshev; do
    s=$(ms)
    /tmp/sparse-knn knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >/dev/null 2>>$L
    e=$(ms)
    echo "knn metric=$metric round=$round wall_ms=$((e - s))" | tee -a $L
  done
done
RUST_LOG=datafusion_sparse_knn=info timeout 100 /tmp/sparse-knn bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "run [0-9]|^gpu|^metric" | tee -a $L
pack
