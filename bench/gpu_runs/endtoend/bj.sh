#!/usr/bin/env bash
# Call BJ (one GPU, 2026-11-26; issue 14 item 0): the count bits of the certified metrics compiled
# only into their kernels (MetricDef::CERTIFIED). Old (61cbb25) and new alternated, bench
# cosine best of 2; then every GPU test on the new build.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
for f in devbin/k/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
run() {  # shape round metrics
  for v in old new; do
    echo "== $1 round $2 $v" | tee -a $W/bench.log
    timeout 100 /tmp/sk_$v bench --input /tmp/$1.parquet --metrics $3 --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
  done
}
for s in movielens nytimes secedgar; do
  /tmp/sk_new generate --shape $s --seed 0 --output /tmp/$s.parquet --overwrite 2>&1 | tail -1 | tee -a $W/bench.log
  run $s 1 cosine
  [ $s = secedgar ] || run $s 2 cosine
done
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
echo done | tee -a $W/device.txt
