#!/usr/bin/env bash
# Call AW (one GPU, 2026-11-26): the figures for the plot (issue 14 item 6) and item 0's ratios on
# this tree (9c8346d): for each paper shape at full size, bench --json of cosine, euclidean and
# manhattan (full self joins, best of 2) and anchors.py on the same file in the same call.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee $W/device.txt
xz -T4 -dc devbin/e2e/sk_new.xz > /tmp/sk_new && chmod +x /tmp/sk_new
for s in movielens nytimes secedgar scrna; do
  /tmp/sk_new generate --shape $s --seed 0 --output /tmp/$s.parquet 2>&1 | tail -1 | tee -a $W/log.txt
  timeout 150 /tmp/sk_new bench --input /tmp/$s.parquet --metrics cosine,euclidean,manhattan --devices gpu -k 10 --repeat 2 --json $W/ours_$s.json 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
  PYTHONUNBUFFERED=1 OUT=/tmp timeout 150 python3 devbin/e2e/anchors.py --parquet $s=/tmp/$s.parquet 2>&1 | grep -E "batch|^$s " | tee -a $W/log.txt
  cp /tmp/anchors.json $W/anchors_$s.json 2>/dev/null
done
echo done | tee -a $W/log.txt
