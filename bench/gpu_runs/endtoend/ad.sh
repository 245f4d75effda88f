#!/usr/bin/env bash
# Call AD (one GPU, 2026-11-25; issue 14 item 5): knn's left read-ahead during the build limited
# to the first partition (new) against every partition reading ahead (old, the same code
# otherwise), alternated, against bench; the outputs of both compared; debug timelines.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
ms() { echo $(( $(date +%s%N) / 1000000 )); }
for r in 1 2 3; do for metric in cosine manhattan; do for b in sk_old sk_new; do
  s=$(ms); /tmp/$b knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out_$b.parquet --overwrite > /dev/null 2>&1; e=$(ms)
  echo "knn $b metric=$metric round=$r wall_ms=$((e - s))" | tee -a $W/log.txt
done; done; done
for b in sk_old sk_new; do
  echo "$b manhattan output: $(/tmp/sk_new sql -c "SELECT count(*), sum(distance), sum(neighbor_id * 1.0 * rank), sum(query_id * 1.0) FROM '/tmp/data/out_$b.parquet'" 2>&1 | grep -v '^+' | tail -1)" | tee -a $W/log.txt
done
timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
for b in sk_old sk_new; do
  t=$W/timeline_${b}_cosine.txt
  echo "process start $(date -u +%H:%M:%S.%N)" > $t
  RUST_LOG=datafusion_sparse_knn=debug /tmp/$b knn --left $f --right $f --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >> $t 2>&1
  echo "process end $(date -u +%H:%M:%S.%N)" >> $t
done
