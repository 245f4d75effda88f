#!/usr/bin/env bash
# Call T (one GPU, main at ac5715d): radius_join against knn_join k=100 at the paper shapes, with
# radii chosen to give about 100 pairs a row (issue 14 item 4), through SQL in fresh processes.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
xz -dc devbin/t/sparse-knn.xz > /tmp/sparse-knn; chmod +x /tmp/sparse-knn
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
mkdir -p /tmp/data
L=$OUT/radius_t.log
run() { # shape query
  local f=/tmp/data/$1.parquet q=$2
  s=$(date +%s%N); timeout 60 /tmp/sparse-knn sql -c "SELECT count(*) AS pairs FROM $q" > /tmp/o.txt 2>&1; rc=$?; e=$(date +%s%N)
  p=$(grep -oE '[0-9]{3,}' /tmp/o.txt | tail -1)
  echo "$1 ${q%%(*} $(echo $q | grep -oE "'cosine', [0-9.]+") rc=$rc wall_ms=$(( (e - s) / 1000000 )) pairs=$p" | tee -a $L
}
for spec in "secedgar 0.5 0.6 0.65" "scrna 0.74 0.77 0.8" "movielens 0.75 0.8"; do
  set -- $spec; shape=$1; shift
  f=/tmp/data/$shape.parquet
  /tmp/sparse-knn generate --shape $shape --output $f 2>&1 | tail -1 | tee -a $L
  for round in 1 2; do
    run $shape "knn_join('$f', '$f', 'cosine', 100, 'device=gpu')"
    for r in "$@"; do run $shape "radius_join('$f', '$f', 'cosine', $r, 'device=gpu')"; done
  done
  rm -f $f
done
