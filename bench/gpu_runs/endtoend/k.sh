#!/usr/bin/env bash
# Call K: the certified GPU test alone with its progress lines (it ran past 150 s in call J),
# then every other GPU test.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
xz -dc devbin/new/gpu_test.xz > /tmp/gpu_test && chmod +x /tmp/gpu_test
timeout 100 /tmp/gpu_test --ignored --test-threads=1 --nocapture certified 2>&1 | tail -70 | tee $OUT/certified.log
timeout 200 /tmp/gpu_test --ignored --test-threads=1 --skip certified 2>&1 | tail -30 | tee $OUT/others.log
