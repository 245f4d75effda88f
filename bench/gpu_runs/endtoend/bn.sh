#!/usr/bin/env bash
# Call BN: call BL's build plus rows' valid bits read only where some row is null, and the
# segment map's two rules ((1025, 16) or (2049, 8)). gpu_test on the new build; old (4fd7a6b)
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
