#!/usr/bin/env bash
# Call O: where a cosine probe's kernel time goes (issue 14 item 0): Nsight Compute on one
# 16,384-row folded_knn launch of the movielens self-join at full size (the third launch, past
# the warm-up), speed-of-light, memory, occupancy, warp-state and launch sections; then the same
# for manhattan, and counts of the work the launch does for the roofline estimate.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
xz -dc devbin/new/sparse-knn.xz > /tmp/sparse-knn && chmod +x /tmp/sparse-knn
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee $OUT/log.txt
f=/tmp/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $OUT/log.txt
for metric in cosine manhattan; do
  timeout 200 $NCU --kernel-name folded_knn --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    /tmp/sparse-knn bench --input $f --metrics $metric --devices gpu -k 10 --repeat 1 --queries 65536 \
    > $OUT/ncu_$metric.txt 2>&1
  echo "$metric rc=$?" | tee -a $OUT/log.txt
  grep -E "Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Shared Memory Configuration|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall" $OUT/ncu_$metric.txt | head -40 | tee -a $OUT/log.txt
done
# Minkowski with p = 3 (the pow-free product path) beside p = 2 and cosine.
for spec in "cosine:" "minkowski:p=3" "minkowski:" "chebyshev:"; do
  metric=${spec%%:*}; opts=${spec#*:}
  echo "bench $metric options=$opts" | tee -a $OUT/log.txt
  timeout 60 /tmp/sparse-knn bench --input $f --metrics $metric --devices gpu -k 10 --repeat 2 --options "$opts" 2>&1 | grep -E "^gpu|rror" | tee -a $OUT/log.txt
done
