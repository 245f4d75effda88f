#!/usr/bin/env bash
# Call CA (issue 14 item 5): the build's host work beside the context (each GPU's first chunk
# copied, laid out and prepared while the device opens, against the device's total memory,
# checked against its free memory once it is open). Old = 1d6ac95 (the last session's final
# tree), new = this change, one call on one card: the GPU tests of the new binary (gpu_test);
# bench's cosine on movielens (best of 3) for each; `knn` Parquet -> Parquet as fresh processes,
# old and new alternated three rounds (the process's wall by /usr/bin/time, knn's own total by
# --profile), their outputs compared; two fresh new knn runs with RUST_LOG=debug (millisecond
# stamps of the driver, the context, the read, the build's steps, the output, the close).
# The change was reverted after this call (BENCHMARKS.md, "End to end, fresh process and warm
# one"); the outputs' comparison below printed the table's border instead of its row (call CB
# compares knn's output with the SQL join's).
source bench/gpu_runs/endtoend/lib.sh
run_tests 240 gpu_test tests.log
generate movielens
for v in old new; do
  echo "== bench $v" | tee -a $W/bench.log
  timeout 60 /tmp/sk_$v bench --input /tmp/movielens.parquet --metrics cosine --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
done
for r in 1 2 3; do
  for v in old new; do
    echo "== knn round $r $v" | tee -a $W/knn.log
    /usr/bin/time -f "knn wall %e s" /tmp/sk_$v knn --left /tmp/movielens.parquet --right /tmp/movielens.parquet --metric cosine -k 10 --device gpu --output /tmp/out_$v.parquet --overwrite --profile 2>&1 | grep -E "wall|total|first pairs|closed|^knn:" | tee -a $W/knn.log
  done
done
for v in old new; do
  echo "== output $v" | tee -a $W/knn.log
  /tmp/sk_new sql --table o=/tmp/out_$v.parquet -c "SELECT count(*) AS n, sum(query_id * 1000003 + neighbor_id * rank) AS ids, round(sum(distance), 4) AS d FROM o" 2>&1 | tail -3 | head -1 | tee -a $W/knn.log
done
for r in 1 2; do
  { echo "process start $(date +%H:%M:%S.%N)"; RUST_LOG=datafusion_sparse_knn=debug /tmp/sk_new knn --left /tmp/movielens.parquet --right /tmp/movielens.parquet --metric cosine -k 10 --device gpu --output /tmp/out.parquet --overwrite --profile 2>&1; echo "process end $(date +%H:%M:%S.%N)"; } | grep -v "folded_knn:\|probed left rows" > $W/knn_timeline_$r.txt
done
for v in old new; do
  echo "== bench again $v" | tee -a $W/bench.log
  timeout 60 /tmp/sk_$v bench --input /tmp/movielens.parquet --metrics cosine --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
done
echo done | tee -a $W/device.txt
