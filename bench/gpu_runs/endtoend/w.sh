#!/usr/bin/env bash
# Call W (one GPU, final build with Probed::parts): the GPU tests.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in devbin/new/*.xz devbin/sql/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 150 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -16 | tee $OUT/gpu_test.log
timeout 120 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | tail -8 | tee $OUT/gpu_sql_test.log
