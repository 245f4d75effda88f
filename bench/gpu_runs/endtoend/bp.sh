#!/usr/bin/env bash
# Call BP (issue 14 items 0, 2, 5, 6): the final tree. be.sh at the four paper shapes (bench of
# cosine, euclidean, manhattan and anchors.py on the same files in the same call; knn --profile
# on movielens three times), then the GPU tests of real_counts and the CLI; every result packed
# into one archive (the call returns only a few files).
OUT=${OUT:-/tmp/out}
SHAPES="secedgar movielens nytimes scrna" TESTS=t bash bench/gpu_runs/endtoend/be.sh
tar -C $OUT -czf /tmp/results.tar.gz . && mv /tmp/results.tar.gz $OUT/
