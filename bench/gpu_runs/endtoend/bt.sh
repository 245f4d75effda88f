#!/usr/bin/env bash
# Call BT (issue 14 items 1, 5): a max's lists built on the device too (its ranks placed beside
# the entries). On movielens, twice: cosine, chebyshev and minkowski with this tree, and
# chebyshev with the host's build of the same binary (SPARSE_KNN_GPU_LISTS=host); one debug run
# of chebyshev; knn --profile three times; then every GPU test: gpu_test, real_counts and the
# CLI's (the CLI binary put where its test looks for it). Results packed in one archive.
source bench/gpu_runs/endtoend/lib.sh
unpack_tests
generate movielens
for round in 1 2; do
  echo "== round $round device lists" | tee -a $W/bench.log
  timeout 100 /tmp/sk_new bench --input /tmp/movielens.parquet --metrics cosine,chebyshev,minkowski --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
  echo "== round $round host lists" | tee -a $W/bench.log
  SPARSE_KNN_GPU_LISTS=host timeout 100 /tmp/sk_new bench --input /tmp/movielens.parquet --metrics chebyshev --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
done
RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_new bench --input /tmp/movielens.parquet --metrics chebyshev --devices gpu -k 10 --repeat 1 > $W/debug_new_chebyshev.log 2>&1
for r in 1 2 3; do
  /usr/bin/time -f "knn wall %e s" /tmp/sk_new knn --left /tmp/movielens.parquet --right /tmp/movielens.parquet --metric cosine -k 10 --device gpu --output /tmp/out.parquet --overwrite --profile 2>&1 | tail -14 | tee -a $W/knn.log
done
gpu_tests
run_tests 150 real_counts_test gpu_test.log
mkdir -p /work/main/target/release && cp /tmp/sk_new /work/main/target/release/sparse-knn
run_tests 150 cli_test gpu_test.log
tar -C $W -czf /tmp/results.tar.gz --exclude results.tar.gz . && mv /tmp/results.tar.gz $W/
echo done
