#!/usr/bin/env bash
# Call BO: call BN's build plus the inverted lists' entries as (row, value) in one 8-byte load,
# the high word's atomic unconditional. gpu_test on the new build; old (4fd7a6b)
# and new alternated on movielens, nytimes and secedgar cosine, movielens manhattan.
source bench/gpu_runs/endtoend/lib.sh
gpu_tests
for s in movielens nytimes secedgar; do generate $s; done
for r in 1 2; do
  alternate movielens $r cosine
  alternate nytimes $r cosine
  alternate secedgar $r cosine
done
alternate movielens 1 manhattan
# The build's phases (the host's prepare writes one 8-byte entry where it wrote two 4-byte ones).
for v in old new; do
  RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_$v bench --input /tmp/nytimes.parquet --metrics cosine --devices gpu -k 10 --repeat 2 2>&1 | grep -E "prepared in|built the right" | tee -a $W/build_$v.log
done
