#!/usr/bin/env bash
# Call A (one GPU): dense columns on the tensor cores (issue 14 item 2). The GPU tests (the new
# one first), then scrna and movielens at full size: bench with dense_columns off / auto / fixed
# shares, the anchors (cuSPARSE, torch dense TF32, scikit-learn) on the same scrna file.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in devbin/new/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 /tmp/gpu_test --ignored --test-threads=1 dense_columns 2>&1 | tail -30 | tee $OUT/gpu_test_dense.log
cd /tmp
/tmp/sparse-knn generate --shape scrna --seed 0 --output /tmp/scrna.parquet 2>&1 | tail -1 | tee $OUT/gen.log
/tmp/sparse-knn generate --shape movielens --seed 0 --output /tmp/ml.parquet 2>&1 | tail -1 | tee -a $OUT/gen.log
b() { # label input options metrics
  RUST_LOG=datafusion_sparse_knn=debug timeout 120 /tmp/sparse-knn bench --input $2 --metrics $4 --devices gpu -k 10 --repeat 2 --options "$3" --json $OUT/bench_$1.json --overwrite > $OUT/bench_$1.log 2>&1
  echo "== $1 ($3)"; grep -v "DEBUG\|INFO" $OUT/bench_$1.log | tail -6
  grep -m3 "dense columns\|dense_gemm" $OUT/bench_$1.log | cut -c1-220
}
{
b scrna_off /tmp/scrna.parquet dense_columns=off cosine,dot
b scrna_auto /tmp/scrna.parquet dense_columns=auto cosine,dot
b scrna_005 /tmp/scrna.parquet dense_columns=0.05 cosine
b scrna_015 /tmp/scrna.parquet dense_columns=0.15 cosine
b scrna_auto_euclid /tmp/scrna.parquet dense_columns=auto euclidean
b ml_off /tmp/ml.parquet dense_columns=off cosine
b ml_auto /tmp/ml.parquet dense_columns=auto cosine
b ml_002 /tmp/ml.parquet dense_columns=0.02 cosine
} 2>&1 | tee $OUT/bench_summary.txt
cd -
PYTHONUNBUFFERED=1 OUT=$OUT timeout 150 python3 devbin/anchors.py --parquet scrna=/tmp/scrna.parquet 2>&1 | tail -12 | tee $OUT/anchors.log
timeout 160 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -20 | tee $OUT/gpu_test.log
