#!/usr/bin/env bash
# BENCHMARKS.md "A folder that grows": one `sparse-knn sql` session keeps a right side of ROWS
# nytimes-shaped rows in FILES files; ADDS files of ROWS/FILES rows each arrive one by one (a COPY
# into the folder), and after each the next one-row lookup (which builds the new file's segment)
# and a second, warm one are timed. Then, for the ratios: a fresh build over the grown folder
# (index_cache=0) and, in a second process, the warm lookup of a side built whole (one segment).
#
#   bench/grow.sh                        # ROWS=1000000 FILES=100 ADDS=20 DEVICE=cpu
#   ROWS=11000000 FILES=100 ADDS=1 DEVICE=gpu bench/grow.sh
#
# Knobs: BIN (default target/release/sparse-knn), WORK (data, default bench/data/grow).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/sparse-knn}
ROWS=${ROWS:-1000000}
FILES=${FILES:-100}
ADDS=${ADDS:-20}
DEVICE=${DEVICE:-cpu}
WORK=${WORK:-bench/data/grow}
PER_FILE=$(( ROWS / FILES ))
mkdir -p "$WORK/docs" "$WORK/new"
WORK=$(cd "$WORK" && pwd)
rm -f "$WORK"/docs/*.parquet
gen() { "$BIN" generate --shape nytimes --rows "$PER_FILE" --seed "$1" --output "$2" --overwrite > /dev/null 2>&1; }
for i in $(seq 0 $(( FILES - 1 ))); do
    f=$(printf "%s/stock/part%05d.parquet" "$WORK" "$i")
    mkdir -p "$WORK/stock"
    [ -f "$f" ] || gen "$i" "$f"
    ln -f "$f" "$(printf "%s/docs/part%05d.parquet" "$WORK" "$i")"
done
for i in $(seq 1 "$ADDS"); do
    f=$(printf "%s/new/new%05d.parquet" "$WORK" "$i")
    [ -f "$f" ] || gen $(( 100000 + i )) "$f"
done
"$BIN" generate --shape nytimes --rows 1 --seed 999999 --output "$WORK/q.parquet" --overwrite > /dev/null 2>&1

LOOKUP="SELECT max(neighbor_id) FROM knn_join('$WORK/q.parquet', '$WORK/docs/', 'cosine', 10, 'device=$DEVICE');"
{
    echo "$LOOKUP"; echo "$LOOKUP"; echo "$LOOKUP"
    for i in $(seq 1 "$ADDS"); do
        printf "COPY (SELECT * FROM '%s/new/new%05d.parquet') TO '%s/docs/part%05d.parquet' OPTIONS ('format.max_row_group_size' '16384');\n" \
            "$WORK" "$i" "$WORK" $(( FILES + i - 1 ))
        echo "$LOOKUP"; echo "$LOOKUP"
    done
    echo "$LOOKUP"; echo "$LOOKUP"; echo "$LOOKUP"
    echo "${LOOKUP/device=$DEVICE/device=$DEVICE, index_cache=0}"
} > "$WORK/grow.sql"
{ echo "$LOOKUP"; echo "$LOOKUP"; echo "$LOOKUP"; echo "$LOOKUP"; } > "$WORK/whole.sql"
ONE="${LOOKUP/$WORK\/docs\//$WORK/new/new00001.parquet}"
{ echo "$ONE"; echo "$ONE"; echo "$ONE"; } > "$WORK/one.sql"

echo "== grow: $ROWS rows in $FILES files, then $ADDS files of $PER_FILE rows, device=$DEVICE"
"$BIN" sql --timing "$WORK/grow.sql" 2>&1 >/dev/null | tee "$WORK/grow.log" | grep -- '-- statement' > "$WORK/grow.times" || true
"$BIN" sql --timing "$WORK/whole.sql" 2>&1 >/dev/null | grep -- '-- statement' > "$WORK/whole.times" || true
"$BIN" sql --timing "$WORK/one.sql" 2>&1 >/dev/null | grep -- '-- statement' > "$WORK/one.times" || true
python3 - "$WORK/grow.times" "$WORK/whole.times" "$WORK/one.times" "$ADDS" <<'PY'
import re, sys
def times(path):
    return [float(re.search(r": ([\d.]+) s", l)[1]) for l in open(path)]
grow, whole, one, adds = (times(sys.argv[1]), times(sys.argv[2]), times(sys.argv[3]),
                          int(sys.argv[4]))
first_build, warm0 = grow[0], min(grow[1:3])
steps = [grow[3 + 3 * i: 6 + 3 * i] for i in range(adds)]  # copy, grown lookup, warm lookup
tail = grow[3 + 3 * adds:]
warm_after, fresh = min(tail[:3]), tail[3]
whole_warm = min(whole[1:])
grown = [s[1] for s in steps]
print("first build (whole) %.3f s; warm lookup %.4f s" % (first_build, warm0))
for i, s in enumerate(steps, 1):
    print("file %2d: copy %.3f s, next lookup %.4f s, warm %.4f s" % (i, s[0], s[1], s[2]))
print("next lookup after a new file: median %.4f s, max %.4f s (%.3fx a full build)"
      % (sorted(grown)[len(grown) // 2], max(grown), max(grown) / fresh))
one_build = one[0] - min(one[1:])
print("one new file alone: first lookup %.4f s, warm %.4f s (its build ~%.4f s); bound: build + 2x warm = %.4f s"
      % (one[0], min(one[1:]), one_build, one_build + 2 * warm0))
print("full build over the grown folder (index_cache=0) %.3f s" % fresh)
print("warm lookup after %d files: %.4f s; a side built whole: %.4f s (%.2fx)"
      % (adds, warm_after, whole_warm, warm_after / whole_warm))
PY
