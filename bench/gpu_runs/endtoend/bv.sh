#!/usr/bin/env bash
# Call BV (issue 14 item 5; the final tree fea3450): where a fresh `knn` process's time goes now
# that the build is short: knn --profile on movielens with RUST_LOG=debug (millisecond stamps of
# the driver, the context, the read, the build, each probe, the output, the close), twice, beside
# bench; then compute-sanitizer's memcheck on the lists test (every metric, chebyshev's ranks
# included) and on the certified metrics' test.
source bench/gpu_runs/endtoend/lib.sh
generate movielens
timeout 60 /tmp/sk_new bench --input /tmp/movielens.parquet --metrics cosine --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
for r in 1 2; do
  { echo "process start $(date +%H:%M:%S.%N)"; RUST_LOG=datafusion_sparse_knn=debug /tmp/sk_new knn --left /tmp/movielens.parquet --right /tmp/movielens.parquet --metric cosine -k 10 --device gpu --output /tmp/out.parquet --overwrite --profile 2>&1; echo "process end $(date +%H:%M:%S.%N)"; } | grep -v "folded_knn:" > $W/knn_timeline_$r.txt
done
for t in lists_built certified_metrics; do
  timeout 200 compute-sanitizer --tool memcheck /tmp/gpu_test --ignored --test-threads=1 $t 2>&1 | tail -8 >> $W/memcheck.log
done
echo done
