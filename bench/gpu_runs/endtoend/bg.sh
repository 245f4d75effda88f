#!/usr/bin/env bash
# Call BG (one GPU, 2026-11-26; issue 14 item 0): the accumulators zeroed by the finishing pass that
# reads them (no zeroing pass a tile). Old (27d2767) and new alternated on the same files, bench
# cosine best of 2 (scrna: the dense start); then every GPU test on the new build.
source bench/gpu_runs/endtoend/lib.sh
for s in secedgar movielens nytimes scrna; do
  generate $s
  alternate $s 1 cosine
  [ $s = secedgar ] && alternate $s 2 cosine
done
gpu_tests
echo done | tee -a $W/device.txt
