#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
xz -dc devrun/sparse-knn.xz > /tmp/sparse-knn; chmod +x /tmp/sparse-knn
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
mkdir -p /tmp/data
for shape in movielens nytimes secedgar scrna; do
  f=/tmp/data/$shape.parquet
  /tmp/sparse-knn generate --shape $shape --output $f 2>&1 | tail -1 | tee -a $OUT/radius_full.log
  for q in "knn_join('$f', '$f', 'cosine', 100, 'device=gpu')" "radius_join('$f', '$f', 'cosine', 0.7, 'device=gpu')" "radius_join('$f', '$f', 'cosine', 0.85, 'device=gpu')" "radius_join('$f', '$f', 'cosine', 0.95, 'device=gpu')"; do
    s=$(date +%s%N); timeout 90 /tmp/sparse-knn sql -c "SELECT count(*) AS pairs FROM $q" > /tmp/o.txt 2>&1; rc=$?; e=$(date +%s%N)
    p=$(grep -oE '[0-9]{3,}' /tmp/o.txt | tail -1)
    echo "$shape ${q%%(*} $(echo $q | grep -oE "'cosine', [0-9.]+") rc=$rc wall_ms=$(( (e - s) / 1000000 )) pairs=$p" | tee -a $OUT/radius_full.log
    # Larger radii would only find more: stop past ~300 pairs a row (60M-200M pairs).
    [ "${p:-0}" -gt 90000000 ] && [ "${q%%(*}" = radius_join ] && break
  done
done
