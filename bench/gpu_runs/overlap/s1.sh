#!/usr/bin/env bash
# Old binary (bc10405) against new (overlapped read/warm-up/probes) on the movielens shape at full
# size: 1 GPU and 2 GPUs through SQL (EXPLAIN ANALYZE), `bench`, and `knn` Parquet -> Parquet on
# one GPU; then a debug timeline of each, then the GPU tests of the new build.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
for b in sparse-knn sparse-knn-old gpu_test custom_metric_test; do
  [ -f devrun/$b.xz ] && xz -dc devrun/$b.xz > /tmp/$b && chmod +x /tmp/$b
done
f=/tmp/data/movielens.parquet; mkdir -p /tmp/data
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a "$OUT/log.txt"
L=$OUT/log.txt
sqlrun() { # bin metric gpus
  local s=$(date +%s%N)
  /tmp/$1 sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$f', '$f', '$2', 10, 'device=gpu, gpus=$3')" >/tmp/plan.txt 2>&1
  local e=$(date +%s%N)
  echo "sql bin=$1 metric=$2 gpus=$3 wall_ms=$(( (e - s) / 1000000 )) $(grep -oE 'build_read_time=[^,]*|build_time=[^,]*|build_shards=[0-9]+|kernel_time[a-z0-9_]*=[^,]*' /tmp/plan.txt | tr '\n' ' ')" | tee -a $L
}
for round in 1 2; do
  for metric in cosine manhattan; do
    for b in sparse-knn-old sparse-knn; do
      sqlrun $b $metric 0; sqlrun $b $metric 0,1
    done
  done
done
# bench (the operator in one process, data in memory): one GPU, then both.
for b in sparse-knn-old sparse-knn; do
  for vis in 0 0,1; do
    echo "bench bin=$b visible=$vis" | tee -a $L
    CUDA_VISIBLE_DEVICES=$vis timeout 200 /tmp/$b bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | tail -3 | tee -a $L
  done
done
# knn Parquet -> Parquet on one GPU, alternating old and new.
for round in 1 2; do
  for metric in cosine manhattan; do
    for b in sparse-knn-old sparse-knn; do
      s=$(date +%s%N)
      CUDA_VISIBLE_DEVICES=0 /tmp/$b knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >/dev/null 2>>$L
      e=$(date +%s%N)
      echo "knn bin=$b metric=$metric round=$round wall_ms=$(( (e - s) / 1000000 ))" | tee -a $L
    done
  done
done
# Timelines (millisecond log stamps) of the new binary.
CUDA_VISIBLE_DEVICES=0 RUST_LOG=datafusion_sparse_knn=debug /tmp/sparse-knn knn --left $f --right $f --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite > $OUT/timeline_knn_1gpu.txt 2>&1
RUST_LOG=datafusion_sparse_knn=debug /tmp/sparse-knn sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$f', '$f', 'cosine', 10, 'device=gpu, gpus=0,1')" > $OUT/timeline_sql_2gpu.txt 2>&1
RUST_LOG=datafusion_sparse_knn=debug /tmp/sparse-knn sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$f', '$f', 'cosine', 10, 'device=gpu, gpus=0')" > $OUT/timeline_sql_1gpu.txt 2>&1
echo "== tests" | tee -a $L
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -15 | tee $OUT/gpu_test.log
timeout 60 /tmp/custom_metric_test --include-ignored --test-threads=1 2>&1 | tail -8 | tee -a $OUT/gpu_test.log
