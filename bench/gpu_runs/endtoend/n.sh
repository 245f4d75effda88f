#!/usr/bin/env bash
# Call N: every metric at the movielens shape, 100,000 rows (the size of call 9 and of the
# anchors in bench/gpu_runs/anchors_movielens_scrna.json), full self-join, k = 10, this build;
# the metrics this session changed also with call I's build (before chebyshev's new kernels and
# the one-pass certified probe). JSON for bench/plot.py.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
for f in devbin/*/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
f=/tmp/movielens.parquet
/tmp/sparse-knn generate --shape movielens --rows 100000 --output $f 2>&1 | tail -1 | tee $OUT/log.txt
ALL=dot,cosine,euclidean,sqeuclidean,manhattan,chebyshev,minkowski,canberra,braycurtis,hamming,jaccard,dice,russellrao,correlation,hellinger,jensenshannon,kl_divergence
timeout 300 /tmp/sparse-knn bench --input $f --metrics $ALL --devices gpu -k 10 --repeat 2 --json $OUT/new_full_movielens.json 2>&1 | grep -E "^gpu|^metric|rror" | tee -a $OUT/log.txt
timeout 200 /tmp/sparse-knn-i bench --input $f --metrics chebyshev,minkowski,hellinger,jensenshannon --devices gpu -k 10 --repeat 1 --json $OUT/old_full_movielens.json 2>&1 | grep -E "^gpu|^metric|rror" | tee -a $OUT/log.txt
