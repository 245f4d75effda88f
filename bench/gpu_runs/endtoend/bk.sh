#!/usr/bin/env bash
# Call BK: where the folded kernel's instructions go (issue 14 item 0). Nsight Compute's source
# counters on one folded_knn launch of the movielens cosine self-join (the third launch), printed
# per SASS instruction; then the join's time at the default tile height against half of it (how
# much a tile's fixed work costs).
source bench/gpu_runs/endtoend/lib.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee $W/log.txt
generate movielens
f=/tmp/movielens.parquet
timeout 240 $NCU --clock-control none --kernel-name folded_knn --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section InstructionStats --section WarpStateStats --section SpeedOfLight \
  --section LaunchStats -o /tmp/prof \
  /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 1 --queries 65536 \
  > $W/ncu_run.txt 2>&1
echo "ncu rc=$?" | tee -a $W/log.txt
$NCU --import /tmp/prof.ncu-rep --page source --csv --print-source sass > $W/sass.csv 2> $W/sass.err
echo "source page rc=$? $(wc -l < $W/sass.csv) lines" | tee -a $W/log.txt
$NCU --import /tmp/prof.ncu-rep --page details --print-details all > $W/details.txt 2>&1
cp /tmp/prof.ncu-rep $W/ 2>/dev/null
for t in 0 1536; do
  echo "== tile rows ${t:-default}" | tee -a $W/log.txt
  if [ $t = 0 ]; then unset SPARSE_KNN_GPU_TILE_ROWS; else export SPARSE_KNN_GPU_TILE_ROWS=$t; fi
  timeout 100 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done
