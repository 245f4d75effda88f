#!/usr/bin/env bash
# Call BA (one GPU, 2026-11-26; issue 14 item 0): the folded kernels' fixed-point adds as two
# native 32-bit shared atomics (was a 64-bit compare-and-swap loop) and each work item's segment in
# one 8-byte load. Old (6636465) and new binaries alternated on the same generated files, bench
# cosine and manhattan, best of 2; then every GPU test on the new build.
source bench/gpu_runs/endtoend/lib.sh
run() {  # shape round
  for v in old new; do
    echo "== $1 round $2 $v" | tee -a $W/bench.log
    timeout 100 /tmp/sk_$v bench --input /tmp/$1.parquet --metrics cosine,manhattan --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
  done
}
for s in movielens nytimes; do
  generate $s
  run $s 1; run $s 2
done
gpu_tests
for s in secedgar scrna; do
  generate $s
  run $s 1
done
echo done | tee -a $W/device.txt
