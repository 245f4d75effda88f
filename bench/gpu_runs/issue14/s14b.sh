#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
for b in sparse-knn sparse-knn-old gpu_test; do xz -dc devrun/$b.xz > /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
/tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -30 > $OUT/gpu_test.log
grep "test result" $OUT/gpu_test.log
mkdir -p /tmp/data
g=/tmp/data/ml100k.parquet
/tmp/sparse-knn generate --shape movielens --rows 100000 --output $g >/dev/null 2>&1
for round in 1 2; do for b in sparse-knn-old sparse-knn; do
  timeout 120 /tmp/$b bench --input $g --metrics cosine,minkowski,hellinger,jensenshannon --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | paste - - | awk -v b=$b -v r=$round '{print b, "r" r, $2, "wall", $8, "kernel", $10}' | tee -a $OUT/cert.log
done; done
# Radius joins through SQL: about 100 neighbours a row against knn k=100 (cosine), new binary.
for q in "knn_join('$g', '$g', 'cosine', 100, 'device=gpu')" "radius_join('$g', '$g', 'cosine', 0.3, 'device=gpu')" "radius_join('$g', '$g', 'cosine', 0.6, 'device=gpu')"; do
  for round in 1 2; do
    s=$(date +%s%N); /tmp/sparse-knn sql -c "SELECT count(*) AS pairs FROM $q" > /tmp/o.txt 2>&1; e=$(date +%s%N)
    echo "$q round=$round wall_ms=$(( (e - s) / 1000000 )) $(grep -oE '[0-9]{3,}' /tmp/o.txt | tail -1)" | tee -a $OUT/radius.log
  done
done
