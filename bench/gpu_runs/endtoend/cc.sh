#!/usr/bin/env bash
# Call CC: the new GPU test that sweeps memory limits across the three builds of the right
# side's lists (device beside the whole part, host for the whole part, host per streamed part),
# the lists test and the memory-limit test beside it, then compute-sanitizer's memcheck on the
# new test.
source bench/gpu_runs/endtoend/lib.sh
timeout 200 /tmp/gpu_test --ignored --test-threads=1 every_memory_limit lists_built every_metric_matches_cpu_under_memory_limit 2>&1 | grep -E "^test |test result|panicked|assert|limit" | tee $W/tests.log
timeout 300 compute-sanitizer --tool memcheck /tmp/gpu_test --ignored --test-threads=1 every_memory_limit 2>&1 | tail -8 | tee $W/memcheck.log
echo done | tee -a $W/device.txt
