#!/usr/bin/env bash
# Call BI (one GPU, 2026-11-26; issue 14 item 1): chebyshev and minkowski against cosine at the
# movielens shape on the final tree (b569cd7), bench best of 2, two rounds.
source bench/gpu_runs/endtoend/lib.sh
generate movielens --overwrite
for r in 1 2; do
  echo "== round $r" | tee -a $W/bench.log
  timeout 120 /tmp/sk_new bench --input /tmp/movielens.parquet --metrics cosine,chebyshev,minkowski --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
done
echo done | tee -a $W/device.txt
