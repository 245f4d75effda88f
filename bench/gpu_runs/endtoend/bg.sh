#!/usr/bin/env bash
# Call BG (one GPU, 2026-11-26; issue 14 item 0): the accumulators zeroed by the finishing pass that
# reads them (no zeroing pass a tile). Old (27d2767) and new alternated on the same files, bench
# cosine best of 2 (scrna: the dense start); then every GPU test on the new build.
source bench/gpu_runs/endtoend/lib.sh
for s in secedgar movielens nytimes scrna; do
  /tmp/sk_new generate --shape $s --seed 0 --output /tmp/$s.parquet 2>&1 | tail -1 | tee -a $W/bench.log
  alternate $s 1 cosine
  [ $s = secedgar ] && alternate $s 2 cosine
done
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
echo done | tee -a $W/device.txt
