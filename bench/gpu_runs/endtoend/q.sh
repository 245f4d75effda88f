#!/usr/bin/env bash
# Call Q (final binary): `knn` Parquet -> Parquet in fresh processes for cosine and the exact
# metrics, movielens shape at full size; and a minkowski radius_join through SQL (certified
# radius: rows sharing no column on the host) with its pair count against the CPU's.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
xz -dc devbin/new/sparse-knn.xz > /tmp/sparse-knn && chmod +x /tmp/sparse-knn
f=/tmp/movielens.parquet; L=$OUT/log.txt
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee $L
ms() { echo $(( $(date +%s%N) / 1000000 )); }
for metric in cosine minkowski hellinger jensenshannon chebyshev cosine; do
  s=$(ms)
  /tmp/sparse-knn knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/out.parquet --overwrite 2>&1 | grep -E "^knn|rror" | tee -a $L
  e=$(ms); echo "knn metric=$metric wall_ms=$((e - s))" | tee -a $L
done
/tmp/sparse-knn generate --shape movielens --rows 20000 --output /tmp/small.parquet 2>&1 | tail -1 | tee -a $L
for dev in gpu cpu; do
  timeout 120 /tmp/sparse-knn sql -c "SELECT count(*) AS pairs, sum(distance) AS total FROM radius_join('/tmp/small.parquet', '/tmp/small.parquet', 'minkowski', 3.0, 'device=$dev')" 2>&1 | tail -5 | tee -a $L
done
