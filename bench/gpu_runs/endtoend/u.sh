#!/usr/bin/env bash
# Call U (one GPU): radius_join with growing gathers and a roomier pair list (new) against main
# ac5715d (old), beside knn_join k=100, movielens and scrna; debug counts of reruns and probe sizes.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for b in sparse-knn sparse-knn-old; do xz -dc devbin/u/$b.xz > /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
mkdir -p /tmp/data
L=$OUT/radius_u.log
run() { # bin shape query
  local q=$3
  s=$(date +%s%N); timeout 60 /tmp/$1 sql -c "SELECT count(*) AS pairs FROM $q" > /tmp/o.txt 2>&1; rc=$?; e=$(date +%s%N)
  p=$(grep -oE '[0-9]{3,}' /tmp/o.txt | tail -1)
  echo "$1 $2 ${q%%(*} $(echo $q | grep -oE "'cosine', [0-9.]+") rc=$rc wall_ms=$(( (e - s) / 1000000 )) pairs=$p" | tee -a $L
}
for spec in "movielens 0.75 0.8" "scrna 0.77 0.8"; do
  set -- $spec; shape=$1; shift
  f=/tmp/data/$shape.parquet
  /tmp/sparse-knn generate --shape $shape --output $f 2>&1 | tail -1 | tee -a $L
  for round in 1 2; do
    for bin in sparse-knn-old sparse-knn; do
      run $bin $shape "knn_join('$f', '$f', 'cosine', 100, 'device=gpu')"
      for r in "$@"; do run $bin $shape "radius_join('$f', '$f', 'cosine', $r, 'device=gpu')"; done
    done
  done
  for bin in sparse-knn-old sparse-knn; do
    RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/$bin sql -c "SELECT count(*) FROM radius_join('$f', '$f', 'cosine', $1, 'device=gpu')" > $OUT/debug_${shape}_$bin.txt 2>&1
    echo "$bin $shape debug: launches $(grep -c 'folded_radius\|radius' $OUT/debug_${shape}_$bin.txt) reruns $(grep -c 'running again' $OUT/debug_${shape}_$bin.txt)" | tee -a $L
  done
  rm -f $f
done
