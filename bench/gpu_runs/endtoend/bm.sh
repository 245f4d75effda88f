#!/usr/bin/env bash
# Call BM: the new build's (filtered finishing) debug timeline of bench on movielens and nytimes
# cosine (where the wall goes beside the kernels), and Nsight Compute's source counters on one
# folded_knn launch of movielens cosine, as in call BK.
source bench/gpu_runs/endtoend/lib.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for s in movielens nytimes; do
  generate $s
  RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_new bench --input /tmp/$s.parquet --metrics cosine --devices gpu -k 10 --repeat 2 > $W/timeline_$s.txt 2>&1
done
timeout 240 $NCU --clock-control none --kernel-name folded_knn --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight -o /tmp/prof \
  /tmp/sk_new bench --input /tmp/movielens.parquet --metrics cosine --devices gpu -k 10 --repeat 1 --queries 65536 \
  > $W/ncu_run.txt 2>&1
$NCU --import /tmp/prof.ncu-rep --page source --csv --print-source sass > $W/sass.csv 2> $W/sass.err
$NCU --import /tmp/prof.ncu-rep --page details > $W/details.txt 2>&1
