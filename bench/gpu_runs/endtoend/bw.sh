#!/usr/bin/env bash
# Call BW (the final tree: null rows' ranges left out of the lists built on the device): every
# GPU test (gpu_test, real_counts, the CLI's), memcheck on the lists test, and bench of cosine,
# chebyshev and minkowski on movielens (item 1 on the final binary).
source bench/gpu_runs/endtoend/lib.sh
unpack_tests
generate movielens
timeout 100 /tmp/sk_new bench --input /tmp/movielens.parquet --metrics cosine,chebyshev,minkowski --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
gpu_tests
run_tests 150 real_counts_test gpu_test.log
mkdir -p /work/main/target/release && cp /tmp/sk_new /work/main/target/release/sparse-knn
run_tests 150 cli_test gpu_test.log
timeout 150 compute-sanitizer --tool memcheck /tmp/gpu_test --ignored --test-threads=1 lists_built 2>&1 | tail -8 > $W/memcheck.log
echo done
