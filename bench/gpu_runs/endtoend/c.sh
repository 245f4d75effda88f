#!/usr/bin/env bash
# Call C (final build): the GPU tests; on two GPUs the SQL tests and the multi-GPU figures (bench
# on one and on both GPUs in the same run, the right side whole on each); the movielens-shape
# end-to-end figures (`bench` against `knn` Parquet -> Parquet, with a debug timeline); the
# certified metrics (old binary beside them where it was carried).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/w; mkdir -p $W
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$W/device.txt"
for f in devbin/*/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
GPUS=$(nvidia-smi -L | wc -l)
L=$W/log.txt
pack() { tar -C /tmp -czf $OUT/c.tgz w; }
timeout 150 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -14 | tee $W/gpu_test.log
[ -x /tmp/gpu_sql_test ] && timeout 150 /tmp/gpu_sql_test --include-ignored --test-threads=1 2>&1 | tail -10 | tee -a $W/gpu_test.log
pack
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
if [ "$GPUS" -ge 2 ]; then
  for round in 1 2; do
    for vis in 0 0,1; do
      echo "bench visible=$vis round=$round" | tee -a $L
      CUDA_VISIBLE_DEVICES=$vis RUST_LOG=datafusion_sparse_knn=info timeout 100 /tmp/sparse-knn bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "run [0-9]|^gpu|^metric" | tee -a $L
    done
  done
  for metric in cosine manhattan; do
    /tmp/sparse-knn sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$f', '$f', '$metric', 10, 'device=gpu')" > $W/explain_2gpu_$metric.txt 2>&1
  done
  CUDA_VISIBLE_DEVICES=0,1 RUST_LOG=datafusion_sparse_knn=debug timeout 100 /tmp/sparse-knn bench --input $f --metrics cosine --devices gpu -k 10 --repeat 1 > $W/bench_2gpu_debug.log 2>&1
  pack
fi
export CUDA_VISIBLE_DEVICES=0
ms() { echo $(( $(date +%s%N) / 1000000 )); }
RUST_LOG=datafusion_sparse_knn=info timeout 100 /tmp/sparse-knn bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "run [0-9]|^gpu|^metric" | tee -a $L
for round in 1 2 3; do
  for metric in cosine manhattan; do
    s=$(ms)
    /tmp/sparse-knn knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >/dev/null 2>>$L
    e=$(ms)
    echo "knn metric=$metric round=$round wall_ms=$((e - s))" | tee -a $L
  done
done
echo "process start $(date -u +%H:%M:%S.%N)" > $W/timeline_cosine.txt
RUST_LOG=datafusion_sparse_knn=debug /tmp/sparse-knn knn --left $f --right $f --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >> $W/timeline_cosine.txt 2>&1
echo "process end $(date -u +%H:%M:%S.%N)" >> $W/timeline_cosine.txt
pack
for spec in "sparse-knn:minkowski" "sparse-knn-old:minkowski" "sparse-knn:jensenshannon" "sparse-knn:hellinger" "sparse-knn-old:hellinger"; do
  bin=${spec%%:*}; metric=${spec#*:}
  [ -x /tmp/$bin ] || continue
  echo "certified $bin $metric" | tee -a $L
  RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/$bin bench --input $f --metrics $metric --devices gpu -k 10 --repeat 1 > $W/certified_${bin}_$metric.log 2>&1
  grep -E "^gpu|^metric" $W/certified_${bin}_$metric.log | tee -a $L
  pack
done
