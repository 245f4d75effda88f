#!/usr/bin/env bash
# Call BJ (one GPU, 2026-11-26; issue 14 item 0): the count bits of the certified metrics compiled
# only into their kernels (MetricDef::CERTIFIED). Old (61cbb25) and new alternated, bench
# cosine best of 2; then every GPU test on the new build.
source bench/gpu_runs/endtoend/lib.sh
for s in movielens nytimes secedgar; do
  /tmp/sk_new generate --shape $s --seed 0 --output /tmp/$s.parquet --overwrite 2>&1 | tail -1 | tee -a $W/bench.log
  alternate $s 1 cosine
  [ $s = secedgar ] || alternate $s 2 cosine
done
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
echo done | tee -a $W/device.txt
