#!/usr/bin/env bash
# Call AO (one GPU, 2026-11-25): issue 14 item 0 on this tree. For each paper shape at full size:
# our cosine self join (bench, best of 2, kernels beside) and anchors.py's cuSPARSE (and torch
# dense TF32 where dense enough) on the same file in the same call; then Nsight Compute on one
# folded_knn launch of 8,192 left rows per shape (where the issue slots go: stall reasons,
# pipes, memory), for the roofline notes (bench/roofline.py gives the bytes).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee $W/device.txt
xz -T4 -dc devbin/e2e/sk_new.xz > /tmp/sk_new && chmod +x /tmp/sk_new
for s in movielens nytimes secedgar scrna; do
  /tmp/sk_new generate --shape $s --seed 0 --output /tmp/$s.parquet 2>&1 | tail -1 | tee -a $W/log.txt
  timeout 90 /tmp/sk_new bench --input /tmp/$s.parquet --metrics cosine --devices gpu -k 10 --repeat 2 --json $W/$s.json 2>&1 | grep "^gpu" | tee -a $W/log.txt
  PYTHONUNBUFFERED=1 OUT=/tmp timeout 120 python3 devbin/e2e/anchors.py --parquet $s=/tmp/$s.parquet 2>&1 | grep -E "batch|^$s " | tee -a $W/log.txt
  cp /tmp/anchors.json $W/anchors_$s.json 2>/dev/null
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
for s in movielens nytimes secedgar scrna; do
  timeout 100 $NCU --kernel-name folded_knn --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
    /tmp/sk_new bench --input /tmp/$s.parquet --metrics cosine --devices gpu -k 10 --queries 32768 --repeat 1 > $W/ncu_$s.txt 2>&1
  tail -3 $W/ncu_$s.txt
done
echo done | tee -a $W/log.txt
