#!/usr/bin/env bash
# Call BU (issue 14 items 0, 2, 5, 6): the final tree (lists built on the device). be.sh at the
# four paper shapes: bench of cosine, euclidean and manhattan and anchors.py on the same files in
# the same call, knn --profile on movielens three times; every result packed in one archive
# (the call returns only a few files).
OUT=${OUT:-/tmp/out}
SHAPES="secedgar movielens nytimes scrna" bash bench/gpu_runs/endtoend/be.sh
tar -C $OUT -czf /tmp/results.tar.gz . && mv /tmp/results.tar.gz $OUT/
