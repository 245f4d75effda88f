#!/usr/bin/env bash
# Call 5 (final build): the GPU tests (library and SQL: multi-GPU, k = 5000, faults), then the
# movielens-shape figures of this build: bench and knn Parquet -> Parquet on one GPU (the
# end-to-end ratio), bench and SQL on one and two GPUs (the multi-GPU ratio), with timelines.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$OUT/device.txt"
for b in sparse-knn gpu_test gpu_sql_test; do
  [ -f devrun/$b.xz ] && xz -dc devrun/$b.xz > /tmp/$b && chmod +x /tmp/$b
done
L=$OUT/log.txt
timeout 200 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -12 | tee $OUT/gpu_test.log
timeout 200 /tmp/gpu_sql_test --include-ignored --test-threads=1 2>&1 | tail -14 | tee -a $OUT/gpu_test.log
f=/tmp/data/movielens.parquet; mkdir -p /tmp/data
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
ms() { echo $(( $(date +%s%N) / 1000000 )); }
for vis in 0 0,1; do
  echo "bench visible=$vis" | tee -a $L
  CUDA_VISIBLE_DEVICES=$vis RUST_LOG=datafusion_sparse_knn=info timeout 200 /tmp/sparse-knn bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "run [0-9]|^gpu|^metric" | tee -a $L
done
for round in 1 2 3; do
  for metric in cosine manhattan; do
    s=$(ms)
    CUDA_VISIBLE_DEVICES=0 /tmp/sparse-knn knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >/dev/null 2>>$L
    e=$(ms)
    echo "knn metric=$metric round=$round wall_ms=$((e - s))" | tee -a $L
    for gpus in 0 0,1; do
      s=$(ms)
      /tmp/sparse-knn sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$f', '$f', '$metric', 10, 'device=gpu, gpus=$gpus')" >/tmp/plan.txt 2>&1
      e=$(ms)
      echo "sql metric=$metric gpus=$gpus wall_ms=$((e - s)) $(grep -oE 'build_read_time=[^,]*|build_time=[^,]*|build_shards=[0-9]+|kernel_time[a-z0-9_]*=[^,]*' /tmp/plan.txt | tr '\n' ' ')" | tee -a $L
    done
  done
done
for spec in "knn_1gpu:0" "knn_2gpu:0,1"; do
  n=${spec%%:*}; vis=${spec#*:}
  echo "process start $(date -u +%H:%M:%S.%N)" > $OUT/timeline_$n.txt
  CUDA_VISIBLE_DEVICES=$vis RUST_LOG=datafusion_sparse_knn=debug /tmp/sparse-knn knn --left $f --right $f --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >> $OUT/timeline_$n.txt 2>&1
  echo "process end $(date -u +%H:%M:%S.%N)" >> $OUT/timeline_$n.txt
done
