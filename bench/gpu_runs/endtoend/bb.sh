#!/usr/bin/env bash
# Call BB (one GPU, 2026-11-26; issue 14 item 0): tile height and occupancy of the folded kernels,
# one binary (1511590 plus two knobs): the tile sized for 4 blocks a SM (default; the kernels'
# 40 registers let only 3 run), for 3 and 2 (SPARSE_KNN_GPU_BLOCKS_PER_SM), and 4 blocks forced by
# __launch_bounds__ (SPARSE_KNN_GPU_MIN_BLOCKS=4: 32 registers). bench cosine and manhattan, best of 2.
# (The tile knob SPARSE_KNN_GPU_BLOCKS_PER_SM was dropped after this call; SPARSE_KNN_GPU_MIN_BLOCKS stays as
# an override of the per-metric bound. The "default" here had __launch_bounds__(512, 1): 70 registers.)
source bench/gpu_runs/endtoend/lib.sh
one() {  # shape label env...
  s=$1; l=$2; shift 2
  echo "== $s $l" | tee -a $W/bench.log
  env "$@" RUST_LOG=datafusion_sparse_knn::gpu::launch=debug timeout 100 /tmp/sk_new bench --input /tmp/$s.parquet --metrics cosine,manhattan --devices gpu -k 10 --repeat 2 > /tmp/o.txt 2>&1
  grep -m1 -oE "tile [0-9]+ \([0-9]+ tiles\), [0-9]+ registers" /tmp/o.txt | tee -a $W/bench.log
  grep -E "^gpu|^metric" /tmp/o.txt | tee -a $W/bench.log
}
for s in movielens nytimes secedgar scrna; do
  generate $s
  for r in 1 2; do
    one $s default X=1
    one $s bps3 SPARSE_KNN_GPU_BLOCKS_PER_SM=3
    one $s bps2 SPARSE_KNN_GPU_BLOCKS_PER_SM=2
    one $s min4 SPARSE_KNN_GPU_MIN_BLOCKS=4
    [ $s = scrna ] && break
  done
done
echo done | tee -a $W/device.txt
