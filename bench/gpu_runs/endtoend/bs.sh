#!/usr/bin/env bash
# Call BS (issue 14 items 0, 5): the inverted lists built on the device (src/gpu/lists.rs).
# Old = e195f36 (host build), new = this tree, alternated in the same call: cosine at the
# movielens, nytimes and scrna shapes (scrna has dense columns, filled from the device's lists);
# one debug run of each binary for the build's steps; knn --profile on movielens (new) twice;
# every GPU test (gpu_test, with the new host-against-device lists test); compute-sanitizer's
# memcheck on that test. Results packed in one archive.
source bench/gpu_runs/endtoend/lib.sh
for s in movielens nytimes scrna; do generate $s; done
for round in 1 2; do
  for s in movielens nytimes scrna; do alternate $s $round cosine; done
done
for v in old new; do
  RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_$v bench --input /tmp/movielens.parquet --metrics cosine --devices gpu -k 10 --repeat 1 > $W/debug_${v}_cosine.log 2>&1
done
for r in 1 2; do
  /usr/bin/time -f "knn wall %e s" /tmp/sk_new knn --left /tmp/movielens.parquet --right /tmp/movielens.parquet --metric cosine -k 10 --device gpu --output /tmp/out.parquet --overwrite --profile 2>&1 | tail -14 | tee -a $W/knn.log
done
gpu_tests
timeout 150 compute-sanitizer --tool memcheck /tmp/gpu_test --ignored --test-threads=1 lists_built 2>&1 | tail -25 > $W/memcheck.log
tar -C $W -czf /tmp/results.tar.gz --exclude results.tar.gz . && mv /tmp/results.tar.gz $W/
echo done
