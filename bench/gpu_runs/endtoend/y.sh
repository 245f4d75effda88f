#!/usr/bin/env bash
# Call Y (one GPU, 2026-11-25; issue 14 item 5): where knn's time beyond bench goes. The same
# build as call X: knn with and without --exclude-self (which reads the one input once and probes
# its own rows, against reading it again as the left side), bench's own debug timeline, the
# Parquet scan alone through SQL, and a perf profile of knn where perf exists.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader; nproc; grep -m1 'model name' /proc/cpuinfo; cat /sys/kernel/mm/transparent_hugepage/enabled; which perf nsys; } 2>&1 | tee "$W/device.txt"
for f in devbin/e2e/sk_new.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
L=$W/log.txt
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
ms() { echo $(( $(date +%s%N) / 1000000 )); }
timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $L
for round in 1 2 3; do
  for metric in cosine manhattan; do
    for x in "" "--exclude-self"; do
      s=$(ms)
      /tmp/sk_new knn --left $f --right $f --metric $metric -k 10 --device gpu $x --output /tmp/data/out.parquet --overwrite >/dev/null 2>>$L
      e=$(ms)
      echo "knn metric=$metric round=$round $x wall_ms=$((e - s))" | tee -a $L
    done
  done
done
for round in 1 2 3; do
  s=$(ms); /tmp/sk_new sql -c "SELECT sum(sparse_nnz(vec)) FROM '$f'" > /dev/null 2>&1; e=$(ms)
  echo "scan alone (sql sum of sparse_nnz) round=$round wall_ms=$((e - s))" | tee -a $L
done
RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 1 > $W/timeline_bench_cosine.txt 2>&1
for x in "" "--exclude-self"; do
  t=$W/timeline_knn_cosine$x.txt
  echo "process start $(date -u +%H:%M:%S.%N)" > $t
  RUST_LOG=datafusion_sparse_knn=debug /tmp/sk_new knn --left $f --right $f --metric cosine -k 10 --device gpu $x --output /tmp/data/out.parquet --overwrite >> $t 2>&1
  echo "process end $(date -u +%H:%M:%S.%N)" >> $t
done
if which perf >/dev/null 2>&1; then
  perf record -F 999 -g -o /tmp/perf.data /tmp/sk_new knn --left $f --right $f --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite > $W/perf_record.txt 2>&1
  perf report -i /tmp/perf.data --no-children --sort symbol 2>/dev/null | grep -E "^ +[0-9]" | head -60 > $W/perf_symbols.txt
  perf report -i /tmp/perf.data --no-children --sort comm 2>/dev/null | grep -E "^ +[0-9]" | head -30 > $W/perf_threads.txt
fi
