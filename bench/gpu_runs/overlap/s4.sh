#!/usr/bin/env bash
# Call 4 (after the driver initialisation moved into the warm-up and the left side is read ahead): the cost of
# starting a process and planning with device=gpu, then old (bc10405) against new: bench (1 and 2
# GPUs, every run logged), SQL through a fresh process (1 and 2 GPUs), knn Parquet -> Parquet.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$OUT/device.txt"
for b in sparse-knn sparse-knn-old; do
  [ -f devrun/$b.xz ] && xz -dc devrun/$b.xz > /tmp/$b && chmod +x /tmp/$b
done
L=$OUT/log.txt
f=/tmp/data/movielens.parquet; mkdir -p /tmp/data
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
ms() { echo $(( $(date +%s%N) / 1000000 )); }
for dev in cpu gpu cpu gpu; do
  s=$(ms); /tmp/sparse-knn sql -c "EXPLAIN SELECT count(*) FROM knn_join('$f', '$f', 'cosine', 10, 'device=$dev')" >/dev/null 2>&1; e=$(ms)
  echo "plan device=$dev wall_ms=$((e - s))" | tee -a $L
done
sqlrun() { # bin metric gpus
  local s=$(ms)
  /tmp/$1 sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$f', '$f', '$2', 10, 'device=gpu, gpus=$3')" >/tmp/plan.txt 2>&1
  local e=$(ms)
  echo "sql bin=$1 metric=$2 gpus=$3 wall_ms=$((e - s)) $(grep -oE 'build_read_time=[^,]*|build_time=[^,]*|build_shards=[0-9]+|kernel_time[a-z0-9_]*=[^,]*' /tmp/plan.txt | tr '\n' ' ')" | tee -a $L
}
for b in sparse-knn-old sparse-knn; do
  for vis in 0 0,1; do
    echo "bench bin=$b visible=$vis" | tee -a $L
    CUDA_VISIBLE_DEVICES=$vis RUST_LOG=datafusion_sparse_knn=info timeout 200 /tmp/$b bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "run [0-9]|^gpu|^metric" | tee -a $L
  done
done
for round in 1 2; do
  for metric in cosine manhattan; do
    for b in sparse-knn-old sparse-knn; do
      sqlrun $b $metric 0; sqlrun $b $metric 0,1
    done
  done
done
for round in 1 2; do
  for metric in cosine manhattan; do
    for b in sparse-knn-old sparse-knn; do
      s=$(ms)
      CUDA_VISIBLE_DEVICES=0 /tmp/$b knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >/dev/null 2>>$L
      e=$(ms)
      echo "knn bin=$b metric=$metric round=$round wall_ms=$((e - s))" | tee -a $L
    done
  done
done
for spec in "knn_1gpu:0" "knn_2gpu:0,1"; do
  n=${spec%%:*}; vis=${spec#*:}
  echo "process start $(date -u +%H:%M:%S.%N)" > $OUT/timeline_$n.txt
  CUDA_VISIBLE_DEVICES=$vis RUST_LOG=datafusion_sparse_knn=debug /tmp/sparse-knn knn --left $f --right $f --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >> $OUT/timeline_$n.txt 2>&1
  echo "process end $(date -u +%H:%M:%S.%N)" >> $OUT/timeline_$n.txt
done
CUDA_VISIBLE_DEVICES=0 RUST_LOG=datafusion_sparse_knn=debug /tmp/sparse-knn bench --input $f --metrics cosine --devices gpu -k 10 --repeat 1 > $OUT/timeline_bench_1gpu.txt 2>&1
