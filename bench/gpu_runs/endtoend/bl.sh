#!/usr/bin/env bash
# Call BL: the finishing pass skips rows whose filter value (KeyForm, as on the CPU) is not below
# the k-th row's (issue 14 item 0). gpu_test on the new build; old (4fd7a6b) and new alternated
# on movielens, nytimes and secedgar cosine and movielens manhattan and euclidean; then the
# segment map's rule at other thresholds (SPARSE_KNN_GPU_SEG_MAP=ITEMS,SEGMENTS) on the new build.
source bench/gpu_runs/endtoend/lib.sh
gpu_tests
for s in movielens nytimes secedgar; do generate $s; done
for r in 1 2; do
  alternate movielens $r cosine
  alternate nytimes $r cosine
  alternate secedgar $r cosine
  alternate movielens $r manhattan,euclidean
done
for rule in 1025,16 2049,8 2049,2; do
  for s in movielens nytimes; do
    echo "== seg map $rule $s" | tee -a $W/bench.log
    SPARSE_KNN_GPU_SEG_MAP=$rule timeout 100 /tmp/sk_new bench --input /tmp/$s.parquet --metrics cosine --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu" | tee -a $W/bench.log
  done
done
