#!/usr/bin/env bash
# Call V (one GPU, final build): the GPU tests, then radius_join near 100 pairs a row against
# knn_join k=100 on the secedgar and nytimes shapes (issue 14 item 4), through SQL.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in devbin/new/*.xz devbin/sql/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 150 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -16 | tee $OUT/gpu_test.log
timeout 120 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | tail -8 | tee $OUT/gpu_sql_test.log
mkdir -p /tmp/data
L=$OUT/radius_v.log
run() { # shape query
  local q=$2
  s=$(date +%s%N); timeout 60 /tmp/sparse-knn sql -c "SELECT count(*) AS pairs FROM $q" > /tmp/o.txt 2>&1; rc=$?; e=$(date +%s%N)
  p=$(grep -oE '[0-9]{3,}' /tmp/o.txt | tail -1)
  echo "$1 ${q%%(*} $(echo $q | grep -oE "'cosine', [0-9.]+") rc=$rc wall_ms=$(( (e - s) / 1000000 )) pairs=$p" | tee -a $L
}
for spec in "secedgar 0.5" "nytimes 0.95"; do
  set -- $spec; shape=$1; shift
  f=/tmp/data/$shape.parquet
  /tmp/sparse-knn generate --shape $shape --output $f 2>&1 | tail -1 | tee -a $L
  for round in 1 2; do
    run $shape "knn_join('$f', '$f', 'cosine', 100, 'device=gpu')"
    for r in "$@"; do run $shape "radius_join('$f', '$f', 'cosine', $r, 'device=gpu')"; done
  done
  rm -f $f
done
