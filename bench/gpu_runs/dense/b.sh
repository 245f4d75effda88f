#!/usr/bin/env bash
# Call B (one GPU): the rewritten dense product (128x128 tiles, cp.async, half precision for
# counts, the block filled on the device). The dense GPU test first, then scrna, movielens and
# nytimes at full size with dense_columns off / auto / fixed shares, then every GPU test.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in devbin/new/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 120 /tmp/gpu_test --ignored --test-threads=1 dense_columns 2>&1 | tail -12 | tee $OUT/gpu_test_dense.log
cd /tmp
for s in scrna movielens nytimes; do /tmp/sparse-knn generate --shape $s --seed 0 --output /tmp/$s.parquet 2>&1 | tail -1; done | tee $OUT/gen.log
b() { # label input options metrics
  RUST_LOG=datafusion_sparse_knn=debug timeout 100 /tmp/sparse-knn bench --input $2 --metrics $4 --devices gpu -k 10 --repeat 2 --options "$3" --json $OUT/bench_$1.json --overwrite > $OUT/bench_$1.log 2>&1
  echo "== $1 ($3) $(grep -m1 'dense columns' $OUT/bench_$1.log | sed 's/.*GPU index: //')"
  grep -A2 "^device" $OUT/bench_$1.log | grep "^gpu" | cut -c1-100
  grep "dense_gemm" $OUT/bench_$1.log | tail -1 | sed 's/.*dense_gemm: //'
}
{
b scrna_off /tmp/scrna.parquet dense_columns=off cosine
b scrna_auto /tmp/scrna.parquet dense_columns=auto cosine,dot
b scrna_006 /tmp/scrna.parquet dense_columns=0.06 cosine
b scrna_010 /tmp/scrna.parquet dense_columns=0.10 cosine
b scrna_020 /tmp/scrna.parquet dense_columns=0.20 cosine
b ml_off /tmp/movielens.parquet dense_columns=off cosine
b ml_auto /tmp/movielens.parquet dense_columns=auto cosine
b ml_005 /tmp/movielens.parquet dense_columns=0.05 cosine
b nyt_off /tmp/nytimes.parquet dense_columns=off cosine
b nyt_auto /tmp/nytimes.parquet dense_columns=auto cosine
b nyt_005 /tmp/nytimes.parquet dense_columns=0.05 cosine
} 2>&1 | tee $OUT/bench_summary.txt
cd - > /dev/null
timeout 170 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result" | tee $OUT/gpu_test.log
