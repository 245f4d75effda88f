#!/usr/bin/env bash
# Call BY (the review's mends: one entry walk for the list kernels, one place for a max's ranks on the
# host): every GPU test (gpu_test, real_counts), memcheck on the lists test, and bench of cosine,
# chebyshev and minkowski on movielens (item 1 on the final binary).
source bench/gpu_runs/endtoend/lib.sh
unpack_tests
generate movielens
timeout 100 /tmp/sk_new bench --input /tmp/movielens.parquet --metrics cosine,chebyshev,minkowski --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
gpu_tests
run_tests 150 real_counts_test gpu_test.log
timeout 150 compute-sanitizer --tool memcheck /tmp/gpu_test --ignored --test-threads=1 lists_built 2>&1 | tail -8 > $W/memcheck.log
echo done
