#!/usr/bin/env bash
# Call CD: every GPU test of the final tree (gpu_test carried in devbin/k), one H100.
source bench/gpu_runs/endtoend/lib.sh > /dev/null 2>&1
timeout 400 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $OUT/gpu_test.log | tail -20
