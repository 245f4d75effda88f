#!/usr/bin/env bash
# Call CD: every GPU test of the final tree (gpu_test carried in devbin/k), one H100.
source bench/gpu_runs/endtoend/lib.sh > /dev/null 2>&1
run_tests 400 gpu_test gpu_test.log | tail -20
