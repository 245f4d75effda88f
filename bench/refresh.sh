#!/usr/bin/env bash
# BENCHMARKS.md "A folder that grows", index folders: `sparse-knn index` over a folder of ROWS
# nytimes-shaped rows in FILES files (a full build into an index folder), then one more file of
# ROWS/FILES rows (1% at the defaults) and the same command again (a refresh: the new file's
# segment and a new manifest), and a one-row lookup against the folder before and after (a
# fresh `sparse-knn sql` process each: load, probe).
#
#   bench/refresh.sh                     # ROWS=1000000 FILES=100
#
# Knobs: BIN (default target/release/sparse-knn), WORK (data, default bench/data/grow: the files
# bench/grow.sh generates, shared).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/sparse-knn}
ROWS=${ROWS:-1000000}
FILES=${FILES:-100}
WORK=${WORK:-bench/data/grow}
PER_FILE=$(( ROWS / FILES ))
mkdir -p "$WORK/stock" "$WORK/new" "$WORK/refresh"
WORK=$(cd "$WORK" && pwd)
rm -rf "$WORK/refresh/docs" "$WORK/refresh/docs.skidx"
mkdir -p "$WORK/refresh/docs"
gen() { "$BIN" generate --shape nytimes --rows "$PER_FILE" --seed "$1" --output "$2" --overwrite > /dev/null 2>&1; }
for i in $(seq 0 $(( FILES - 1 ))); do
    f=$(printf "%s/stock/part%05d.parquet" "$WORK" "$i")
    [ -f "$f" ] || gen "$i" "$f"
    ln -f "$f" "$(printf "%s/refresh/docs/part%05d.parquet" "$WORK" "$i")"
done
NEW="$WORK/new/new00001.parquet"
[ -f "$NEW" ] || gen 100001 "$NEW"
"$BIN" generate --shape nytimes --rows 1 --seed 999999 --output "$WORK/q.parquet" --overwrite > /dev/null 2>&1
INDEX="$WORK/refresh/docs.skidx"
LOOKUP="SELECT max(neighbor_id) FROM knn_join('$WORK/q.parquet', '$INDEX', 'cosine', 10, 'device=cpu');"
lookup() { "$BIN" sql --timing -c "$LOOKUP" -c "$LOOKUP" 2>&1 >/dev/null | grep -- '-- statement' | sed 's/.*: \([0-9.]*\) s.*/\1/' | tr '\n' ' '; }
seconds() {
    local s; s=$(date +%s.%N)
    "$@" > /dev/null 2> "$WORK/refresh/last.log" || { cat "$WORK/refresh/last.log" >&2; exit 1; }
    python3 -c "print('%.3f' % ($(date +%s.%N) - $s))"
}

echo "== refresh: $ROWS rows in $FILES files, then one file of $PER_FILE rows"
full=$(seconds "$BIN" index --input "$WORK/refresh/docs/" --output "$INDEX" --metric cosine)
before=$(lookup)
ln -f "$NEW" "$(printf "%s/refresh/docs/part%05d.parquet" "$WORK" "$FILES")"
refresh=$(seconds "$BIN" index --input "$WORK/refresh/docs/" --output "$INDEX")
after=$(lookup)
python3 - "$full" "$refresh" "$before" "$after" <<'PY'
import sys
full, refresh = float(sys.argv[1]), float(sys.argv[2])
before, after = [list(map(float, a.split())) for a in sys.argv[3:5]]
print("full index %.2f s; refresh after 1%% more rows %.2f s (%.1f%% of the full index)"
      % (full, refresh, 100 * refresh / full))
print("one-row lookup, fresh process (first, second): one segment %.4f, %.4f s; after the refresh (2 segments) %.4f, %.4f s"
      % (before[0], before[1], after[0], after[1]))
PY
