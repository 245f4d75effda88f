#!/usr/bin/env bash
# Call BR (issue 14 items 1, 0): chebyshev's walk on native 32-bit shared atomics, and the host
# build of 268c517 (never timed on the device). Old = 5942b1f (calls BO-BQ), new = this tree,
# alternated in the same call: movielens cosine, chebyshev, minkowski and nytimes cosine; then one
# run of each with RUST_LOG=debug for the build's steps and chebyshev's certified passes; then
# every GPU test (gpu_test). Results packed in one archive.
source bench/gpu_runs/endtoend/lib.sh
generate movielens
generate nytimes
for round in 1 2; do
  alternate movielens $round cosine,chebyshev,minkowski
  alternate nytimes $round cosine
done
for v in old new; do
  for m in cosine chebyshev; do
    RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_$v bench --input /tmp/movielens.parquet --metrics $m --devices gpu -k 10 --repeat 1 > $W/debug_${v}_$m.log 2>&1
  done
done
gpu_tests
tar -C $W -czf /tmp/results.tar.gz --exclude results.tar.gz . && mv /tmp/results.tar.gz $W/
echo done
