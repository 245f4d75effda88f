#!/usr/bin/env bash
# Call H (one GPU): the SQL GPU tests on the final build (rows of sum 0 skipped).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
xz -dc devbin/new/gpu_sql_test.xz > /tmp/gpu_sql_test && chmod +x /tmp/gpu_sql_test
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/summary.txt
timeout 120 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee -a $OUT/summary.txt
