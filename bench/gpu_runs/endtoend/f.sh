#!/usr/bin/env bash
# Call F (2026-11-24, second session): the GPU tests (with the new certified test: rows sharing
# no column taken on the host), then the certified metrics on the movielens shape at full size,
# new and old (main before this change, 6f65064) in the same call, cosine beside them.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/w; mkdir -p $W
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$W/device.txt"
for f in devbin/*/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
L=$W/log.txt
pack() { tar -C /tmp -czf $OUT/f.tgz w; }
timeout 120 /tmp/gpu_test --ignored --test-threads=1 certified 2>&1 | tail -30 | tee $W/gpu_test_certified.log
pack
timeout 200 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -40 | tee $W/gpu_test.log
pack
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
for spec in "sparse-knn:minkowski" "sparse-knn:hellinger" "sparse-knn:jensenshannon" "sparse-knn:cosine" "sparse-knn-old:minkowski" "sparse-knn:minkowski" "sparse-knn-old:jensenshannon" "sparse-knn:jensenshannon"; do
  bin=${spec%%:*}; metric=${spec#*:}
  [ -x /tmp/$bin ] || continue
  echo "certified $bin $metric" | tee -a $L
  RUST_LOG=datafusion_sparse_knn=debug timeout 70 /tmp/$bin bench --input $f --metrics $metric --devices gpu -k 10 --repeat 1 > $W/certified_${bin}_$metric.log 2>&1
  grep -E "^gpu|^metric" $W/certified_${bin}_$metric.log | tee -a $L
  grep "certified:" $W/certified_${bin}_$metric.log | tail -3 | tee -a $L
  pack
done
pack
