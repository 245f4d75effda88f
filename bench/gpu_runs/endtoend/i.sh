#!/usr/bin/env bash
# Call I: the GPU tests, then the certified metrics at the movielens shape (full size): this build
# (certified probes release the device between kernel passes) against call H's
# build (the same, but each probe holding the device through its host steps; exact rows built
# after the upload), cosine beside them.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/w; mkdir -p $W
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$W/device.txt"
for f in devbin/*/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
L=$W/log.txt
pack() { tar -C /tmp -czf $OUT/i.tgz w; }
timeout 100 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -16 | tee $W/gpu_test.log
pack
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
for spec in cosine minkowski f:minkowski hellinger f:hellinger jensenshannon f:jensenshannon minkowski hellinger jensenshannon cosine; do
  case $spec in f:*) bin=sparse-knn-h; metric=${spec#f:};; *) bin=sparse-knn; metric=$spec;; esac
  echo "certified $bin $metric" | tee -a $L
  RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/$bin bench --input $f --metrics $metric --devices gpu -k 10 --repeat 1 > $W/bench_${bin}_$metric.log 2>&1
  grep -E "^gpu|^metric" $W/bench_${bin}_$metric.log | tee -a $L
  grep "certified:" $W/bench_${bin}_$metric.log | tail -2 | tee -a $L
  pack
done
