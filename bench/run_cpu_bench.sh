#!/usr/bin/env bash
# The CPU benchmark of BENCHMARKS.md: our CPU backend and the CPU anchors (scikit-learn brute force,
# sparse_dot_topn) on the same Parquet files and queries, dataset by dataset, in one run.
#
#   pip install scikit-learn sparse_dot_topn pyarrow scipy
#   bench/run_cpu_bench.sh            # OUT=/tmp/cpu_bench Q=2000 REPEAT=3 RADIUS=0.5 by default
#
# After the kNN runs (k=10, every metric), a cosine radius join (every pair at cosine distance
# <= RADIUS) on the same datasets and queries; RADIUS= (empty) skips it. Both reports go to
# $OUT/report.md, with each side's pair count for the radius join.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cpu_bench}
Q=${Q:-2000}
REPEAT=${REPEAT:-3}
RADIUS=${RADIUS-0.5}
DATA=${DATA:-../shared/data}
mkdir -p "$OUT"

# Synthetic power-law data (../shared/bench/anchors.py's powerlaw_csr, 50K x 30K): mean degree 40 as
# the README's call, whose duplicate draws merge to nnz 1.4M, and mean degree 60, which gives the
# README's nnz of 2.0M.
for deg in 40 60; do
    [ -f "$OUT/powerlaw_deg$deg.parquet" ] ||
        python3 bench/cpu_anchors.py --synthetic "$OUT/powerlaw_deg$deg.parquet" --mean-deg $deg --metrics "" --skip-topn
done

# Built once and copied, so that edits to the tree during the run change nothing.
exe=$(cargo bench --bench cpu_knn --no-run 2>&1 | tee /dev/stderr | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
cp "$exe" "$OUT/cpu_knn"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "nproc: $(nproc); cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(lscpu | grep -E '^L[23] cache' | tr -s ' ' | paste -sd ';')"
    echo "rustc: $(rustc --version); python: $(python3 --version 2>&1)"
    python3 -c 'import sklearn, sparse_dot_topn, scipy; print("scikit-learn", sklearn.__version__, "sparse_dot_topn", sparse_dot_topn.__version__, "scipy", scipy.__version__)'
} | tee "$OUT/machine.txt"

names=(powerlaw_deg40 powerlaw_deg60 news20)
path_of() {
    case $1 in
        news20) echo "$DATA/news20_bow.parquet" ;;
        *) echo "$OUT/$1.parquet" ;;
    esac
}

pairs=()
for name in "${names[@]}"; do
    path=$(path_of "$name")
    python3 bench/cpu_anchors.py --parquet "$path" -q "$Q" --repeat "$REPEAT" --json "$OUT/anchors_$name.json"
    "$OUT/cpu_knn" --parquet "$path" -q "$Q" --repeat "$REPEAT" --json "$OUT/ours_$name.json"
    pairs+=("$OUT/ours_$name.json" "$OUT/anchors_$name.json")
done

# Radius join, cosine only (the anchors have no other radius search of their own).
if [ -n "$RADIUS" ]; then
    for name in "${names[@]}"; do
        path=$(path_of "$name")
        python3 bench/cpu_anchors.py --parquet "$path" -q "$Q" --repeat "$REPEAT" --metrics cosine \
            --radius "$RADIUS" --json "$OUT/anchors_radius_$name.json"
        "$OUT/cpu_knn" --parquet "$path" -q "$Q" --repeat "$REPEAT" --metrics cosine \
            --radius "$RADIUS" --json "$OUT/ours_radius_$name.json"
        pairs+=("$OUT/ours_radius_$name.json" "$OUT/anchors_radius_$name.json")
    done
fi
python3 bench/cpu_report.py "${pairs[@]}" | tee "$OUT/report.md"
