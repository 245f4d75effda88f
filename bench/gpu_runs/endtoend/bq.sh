#!/usr/bin/env bash
# Call BQ (issue 14 items 1, 0): the final tree (5942b1f). chebyshev and minkowski (p = 3)
# against cosine on movielens (item 1: within 2x); then the segment map's rules on nytimes and
# movielens cosine (the default two rules against (1025, 16) alone), same build.
source bench/gpu_runs/endtoend/lib.sh
generate movielens
timeout 100 /tmp/sk_new bench --input /tmp/movielens.parquet --metrics cosine,chebyshev,minkowski --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
generate nytimes
for rule in default 1025,16 default 1025,16; do
  for s in nytimes movielens; do
    echo "== seg map $rule $s" | tee -a $W/bench.log
    if [ $rule = default ]; then unset SPARSE_KNN_GPU_SEG_MAP; else export SPARSE_KNN_GPU_SEG_MAP=$rule; fi
    timeout 60 /tmp/sk_new bench --input /tmp/$s.parquet --metrics cosine --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu" | tee -a $W/bench.log
  done
done
