#!/usr/bin/env bash
# Call A (one GPU): the GPU tests of this build (replicas on one GPU named three times, the
# backend's own build), then the movielens-shape end-to-end figures: `bench` (the operator) and
# `knn` Parquet -> Parquet, old binary (main before this change, on its own generated file)
# against new (its file of 16K-row groups), with timelines and the exit variants.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$OUT/device.txt"
nproc | tee -a "$OUT/device.txt"
for b in sparse-knn sparse-knn-old gpu_test; do
  [ -f devbin/$b.xz ] && xz -dc devbin/$b.xz > /tmp/$b && chmod +x /tmp/$b
done
L=$OUT/log.txt
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -16 | tee $OUT/gpu_test.log
mkdir -p /tmp/data
new=/tmp/data/movielens.parquet; old=/tmp/data/movielens_old.parquet
/tmp/sparse-knn generate --shape movielens --output $new 2>&1 | tail -1 | tee -a $L
/tmp/sparse-knn-old generate --shape movielens --output $old 2>&1 | tail -1 | tee -a $L
ms() { echo $(( $(date +%s%N) / 1000000 )); }
RUST_LOG=datafusion_sparse_knn=info timeout 200 /tmp/sparse-knn bench --input $new --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "run [0-9]|^gpu|^metric" | tee -a $L
for round in 1 2 3; do
  for metric in cosine manhattan; do
    for spec in "old:sparse-knn-old:$old:" "old_on_new_file:sparse-knn-old:$new:" "new:sparse-knn:$new:" "new_exit:sparse-knn:$new:exit" "new_fast:sparse-knn:$new:fast"; do
      IFS=: read -r name bin file exitmode <<< "$spec"
      s=$(ms)
      SPARSE_KNN_EXIT=$exitmode /tmp/$bin knn --left $file --right $file --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >/dev/null 2>>$L
      e=$(ms)
      echo "knn $name metric=$metric round=$round wall_ms=$((e - s))" | tee -a $L
    done
  done
done
/tmp/sparse-knn sql -c "SELECT count(*), min(rank), max(rank), sum(distance) FROM '/tmp/data/out.parquet'" 2>&1 | tee -a $L
for spec in "new:sparse-knn:$new:" "new_fast:sparse-knn:$new:fast" "old:sparse-knn-old:$old:"; do
  IFS=: read -r name bin file exitmode <<< "$spec"
  echo "process start $(date -u +%H:%M:%S.%N)" > $OUT/timeline_$name.txt
  SPARSE_KNN_EXIT=$exitmode RUST_LOG=datafusion_sparse_knn=debug /tmp/$bin knn --left $file --right $file --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >> $OUT/timeline_$name.txt 2>&1
  echo "process end $(date -u +%H:%M:%S.%N)" >> $OUT/timeline_$name.txt
done
/tmp/sparse-knn sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$new', '$new', 'cosine', 10, 'device=gpu')" > $OUT/explain_new.txt 2>&1
# The certified metrics (an exact step on the host for their candidates): new (candidates that
# share no column with the left row skip the walk) against old, with the step's split.
for bin in sparse-knn sparse-knn-old; do
  for metric in minkowski jensenshannon hellinger; do
    echo "certified $bin $metric" | tee -a $L
    RUST_LOG=datafusion_sparse_knn=debug timeout 100 /tmp/$bin bench --input $new --metrics $metric --devices gpu -k 10 --repeat 1 > $OUT/certified_${bin}_$metric.log 2>&1
    grep -E "^gpu|^metric" $OUT/certified_${bin}_$metric.log | tee -a $L
    grep -c "certified:" $OUT/certified_${bin}_$metric.log | tee -a $L
  done
done
