#!/usr/bin/env bash
# Call BJ (one GPU, 2026-11-26; issue 14 item 0): the count bits of the certified metrics compiled
# only into their kernels (MetricDef::CERTIFIED). Old (61cbb25) and new alternated, bench
# cosine best of 2; then every GPU test on the new build.
source bench/gpu_runs/endtoend/lib.sh
for s in movielens nytimes secedgar; do
  generate $s --overwrite
  alternate $s 1 cosine
  [ $s = secedgar ] || alternate $s 2 cosine
done
gpu_tests
echo done | tee -a $W/device.txt
