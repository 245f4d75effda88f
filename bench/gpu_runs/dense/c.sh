#!/usr/bin/env bash
# Call C (one GPU): after the fix of multi-launch probes. The dense GPU test, then full-size
# scrna (with the anchors in the same run), movielens and nytimes with dense_columns off / auto /
# fixed shares (to set the auto model), then every GPU test. Logs joined into few files.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in devbin/new/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/summary.txt
timeout 120 /tmp/gpu_test --ignored --test-threads=1 dense_columns 2>&1 | tail -8 | tee -a $OUT/summary.txt
cd /tmp
for s in scrna movielens nytimes; do /tmp/sparse-knn generate --shape $s --seed 0 --output /tmp/$s.parquet 2>&1 | tail -1; done | tee -a $OUT/summary.txt
b() { # label input options metrics
  RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sparse-knn bench --input $2 --metrics $4 --devices gpu -k 10 --repeat 2 --options "$3" > /tmp/bench_$1.log 2>&1
  echo "== $1 ($3) $(grep -m1 'dense columns' /tmp/bench_$1.log | sed 's/.*GPU index: //')"
  grep -A2 "^device" /tmp/bench_$1.log | grep "^gpu" | cut -c1-100
  grep "dense_gemm" /tmp/bench_$1.log | tail -1 | sed 's/.*dense_gemm: //'
  grep -v "dense_gemm\|folded_knn" /tmp/bench_$1.log >> $OUT/bench_logs.txt
}
{
b scrna_off /tmp/scrna.parquet dense_columns=off cosine
b scrna_auto /tmp/scrna.parquet dense_columns=auto cosine,dot
b ml_off /tmp/movielens.parquet dense_columns=off cosine
b ml_auto /tmp/movielens.parquet dense_columns=auto cosine
b ml_002 /tmp/movielens.parquet dense_columns=0.02 cosine
b ml_010 /tmp/movielens.parquet dense_columns=0.10 cosine
b nyt_off /tmp/nytimes.parquet dense_columns=off cosine
b nyt_auto /tmp/nytimes.parquet dense_columns=auto cosine
b nyt_005 /tmp/nytimes.parquet dense_columns=0.05 cosine
b nyt_015 /tmp/nytimes.parquet dense_columns=0.15 cosine
} 2>&1 | tee -a $OUT/summary.txt
cp /tmp/bench_scrna_auto.log $OUT/
cd - > /dev/null
PYTHONUNBUFFERED=1 OUT=$OUT timeout 100 python3 devbin/anchors.py --parquet scrna=/tmp/scrna.parquet 2>&1 | grep -v sklearn | tail -8 | tee -a $OUT/summary.txt
timeout 170 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result" | tee -a $OUT/summary.txt
