#!/usr/bin/env bash
# Call BX (issue 14 item 0, a second run on the final tree 24d1a09): movielens and nytimes, bench
# of cosine twice (best of 2 each) and anchors.py on the same files in the same call.
source bench/gpu_runs/endtoend/lib.sh
for s in movielens nytimes; do
  generate $s
  for round in 1 2; do
    timeout 60 /tmp/sk_new bench --input /tmp/$s.parquet --metrics cosine --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
  done
  PYTHONUNBUFFERED=1 OUT=/tmp timeout 200 python3 devbin/k/anchors.py --parquet $s=/tmp/$s.parquet 2>&1 | grep -E "batch|^$s " | tee -a $W/bench.log
done
echo done
