#!/usr/bin/env bash
# Call BD (one GPU, 2026-11-26; issue 14 item 0): dot and cosine skip a tile whole when a left row of
# one chunk has no list entry in it and no row of sum 0 can be taken any more. Old (27d2767) and new
# alternated on the same files, bench cosine best of 2; then every GPU test on the new build.
source bench/gpu_runs/endtoend/lib.sh
for s in secedgar movielens nytimes; do
  generate $s
  alternate $s 1 cosine
  [ $s = secedgar ] && alternate $s 2 cosine
done
gpu_tests
echo done | tee -a $W/device.txt
