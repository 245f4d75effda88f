#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
for b in sparse-knn sparse-knn-old; do xz -dc devrun/$b.xz > /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
mkdir -p /tmp/data
g=/tmp/data/ml100k.parquet
/tmp/sparse-knn generate --shape movielens --rows 100000 --output $g >/dev/null 2>&1
for round in 1 2; do for b in sparse-knn-old sparse-knn; do
for q in "knn_join('$g', '$g', 'cosine', 100, 'device=gpu')" "radius_join('$g', '$g', 'cosine', 0.3, 'device=gpu')" "radius_join('$g', '$g', 'cosine', 0.8, 'device=gpu')"; do
    s=$(date +%s%N); timeout 60 /tmp/$b sql -c "SELECT count(*) AS pairs FROM $q" > /tmp/o.txt 2>&1; e=$(date +%s%N)
    echo "$b round=$round ${q%%(*} $(echo $q | grep -oE "'cosine', [0-9.]+") wall_ms=$(( (e - s) / 1000000 )) pairs=$(grep -oE '[0-9]{3,}' /tmp/o.txt | tail -1)" | tee -a $OUT/radius.log
done; done; done
f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f >/dev/null 2>&1
timeout 200 /tmp/sparse-knn bench --input $f --metrics cosine,minkowski,hellinger,jensenshannon,kl_divergence --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | paste - - | tee -a $OUT/full.log
