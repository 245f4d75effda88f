#!/usr/bin/env bash
# Call B (one GPU): the GPU tests of this build; the movielens-shape end-to-end figures (`bench`
# against `knn` Parquet -> Parquet, new binary, with debug timelines); the certified metrics'
# candidate pass (no second run, candidates grouped without a sort) new against old.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/w; mkdir -p $W
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$W/device.txt"
for b in sparse-knn sparse-knn-old gpu_test; do
  [ -f devbin/$b.xz ] && xz -dc devbin/$b.xz > /tmp/$b && chmod +x /tmp/$b
done
L=$W/log.txt
pack() { tar -C /tmp -czf $OUT/b.tgz w; }
timeout 200 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -18 | tee $W/gpu_test.log
pack
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
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
for metric in cosine manhattan; do
  echo "process start $(date -u +%H:%M:%S.%N)" > $W/timeline_$metric.txt
  RUST_LOG=datafusion_sparse_knn=debug /tmp/sparse-knn knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite >> $W/timeline_$metric.txt 2>&1
  echo "process end $(date -u +%H:%M:%S.%N)" >> $W/timeline_$metric.txt
done
pack
for spec in "sparse-knn:minkowski" "sparse-knn-old:minkowski" "sparse-knn:jensenshannon" "sparse-knn:hellinger"; do
  bin=${spec%%:*}; metric=${spec#*:}
  echo "certified $bin $metric" | tee -a $L
  RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/$bin bench --input $f --metrics $metric --devices gpu -k 10 --repeat 1 > $W/certified_${bin}_$metric.log 2>&1
  grep -E "^gpu|^metric" $W/certified_${bin}_$metric.log | tee -a $L
  pack
done
