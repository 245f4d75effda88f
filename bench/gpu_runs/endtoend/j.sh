#!/usr/bin/env bash
# Call J: the GPU tests (chebyshev now from the inverted lists, certified), then chebyshev at the
# movielens shape (full size) with this build and call I's (union kernels), and the other
# certified metrics with both (this build: one pass for every certified knn, no upper-bound
# pass), cosine beside them.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/w; mkdir -p $W
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$W/device.txt"
for f in devbin/*/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
L=$W/log.txt
pack() { tar -C /tmp -czf $OUT/j.tgz w; }
timeout 150 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -v "^test .* ok$" | tail -40 | tee $W/gpu_test.log
pack
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
for spec in cosine chebyshev i:chebyshev minkowski i:minkowski jensenshannon i:jensenshannon chebyshev cosine; do
  case $spec in i:*) bin=sparse-knn-i; metric=${spec#i:};; *) bin=sparse-knn; metric=$spec;; esac
  echo "bench $bin $metric" | tee -a $L
  RUST_LOG=datafusion_sparse_knn=debug timeout 100 /tmp/$bin bench --input $f --metrics $metric --devices gpu -k 10 --repeat 1 > $W/bench_${bin}_$metric.log 2>&1
  grep -E "^gpu|^metric|rror" $W/bench_${bin}_$metric.log | tee -a $L
  grep "certified:" $W/bench_${bin}_$metric.log | tail -2 | tee -a $L
  pack
done
