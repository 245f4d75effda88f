#!/usr/bin/env bash
# Call AX (one GPU, 2026-11-26): the session's final tree (the CPU's fused logarithm and prefetch
# included): every GPU test, every GPU SQL test, and the GPU CLI tests (knn --profile closing the
# GPU beside the commit; chunked sides), the CLI binary put where the test binary looks for it.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /work/main/target/release && cp /tmp/sk_new /work/main/target/release/sparse-knn
timeout 150 /tmp/cli_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/cli_test.log
timeout 120 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_sql_test.log
timeout 280 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
echo done | tee -a $W/device.txt
