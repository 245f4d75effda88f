#!/usr/bin/env bash
# Call D (one GPU): 8-bit products for small counts, the auto model refitted. The dense GPU test,
# scrna at full size (off / auto, cosine and dot) with the anchors in the same run, movielens
# and nytimes with auto (expected: no dense columns), then every GPU test and the SQL GPU tests.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in devbin/new/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/summary.txt
timeout 150 /tmp/gpu_test --ignored --test-threads=1 dense_columns 2>&1 | tail -8 | tee -a $OUT/summary.txt
cd /tmp
for s in scrna movielens nytimes; do /tmp/sparse-knn generate --shape $s --seed 0 --output /tmp/$s.parquet 2>&1 | tail -1; done | tee -a $OUT/summary.txt
b() { # label input options metrics
  RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sparse-knn bench --input $2 --metrics $4 --devices gpu -k 10 --repeat 3 --options "$3" --json $OUT/$1.json --overwrite > /tmp/bench_$1.log 2>&1
  echo "== $1 ($3) $(grep -m1 'dense columns' /tmp/bench_$1.log | sed 's/.*GPU index: //')"
  grep -A2 "^device" /tmp/bench_$1.log | grep "^gpu" | cut -c1-100
  grep "dense_gemm" /tmp/bench_$1.log | tail -1 | sed 's/.*dense_gemm: //'
  grep "bench: " /tmp/bench_$1.log | sed 's/.*bench: //'
  grep -v "dense_gemm\|folded_knn" /tmp/bench_$1.log >> $OUT/bench_logs.txt
}
{
b scrna_off /tmp/scrna.parquet dense_columns=off cosine
b scrna_auto /tmp/scrna.parquet "" cosine,dot
b ml_auto /tmp/movielens.parquet "" cosine
b nyt_auto /tmp/nytimes.parquet "" cosine
} 2>&1 | tee -a $OUT/summary.txt
cd - > /dev/null
PYTHONUNBUFFERED=1 OUT=$OUT timeout 100 python3 devbin/anchors.py --parquet scrna=/tmp/scrna.parquet 2>&1 | grep -v sklearn | tail -6 | tee -a $OUT/summary.txt
timeout 170 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee -a $OUT/summary.txt
timeout 100 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee -a $OUT/summary.txt
