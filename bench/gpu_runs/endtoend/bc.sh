#!/usr/bin/env bash
# Call BC (one GPU, 2026-11-26; issue 14 item 0): the cheap metrics' folded kernels compiled for
# four blocks a SM (__launch_bounds__, 32 registers) and rows of sum 0 dropped before their valid
# bit is read. Old (1511590, call BA's new) and new alternated on the same files, bench best of 2;
# chebyshev (also four blocks now) once; then every GPU test on the new build.
source bench/gpu_runs/endtoend/lib.sh
run() {  # shape round metrics
  for v in old new; do
    echo "== $1 round $2 $v" | tee -a $W/bench.log
    RUST_LOG=datafusion_sparse_knn::gpu::launch=debug timeout 100 /tmp/sk_$v bench --input /tmp/$1.parquet --metrics $3 --devices gpu -k 10 --repeat 2 > /tmp/o.txt 2>&1
    grep -m1 -oE "tile [0-9]+ \([0-9]+ tiles\), [0-9]+ registers" /tmp/o.txt | tee -a $W/bench.log
    grep -E "^gpu|^metric" /tmp/o.txt | tee -a $W/bench.log
  done
}
for s in movielens nytimes secedgar scrna; do
  generate $s
  run $s 1 cosine,manhattan
  [ $s = movielens ] || [ $s = nytimes ] && run $s 2 cosine,manhattan
  [ $s = movielens ] && run $s 1 chebyshev
done
gpu_tests
echo done | tee -a $W/device.txt
