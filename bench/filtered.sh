#!/usr/bin/env bash
# BENCHMARKS.md "Filtered right sides": one-row lookups against a kept side, each with a right-side
# filter new to the session, against unfiltered lookups in the same session, ROUNDS rounds of every
# kind (one statement each a round, kinds interleaved, so that drift and the first statements'
# costs fall on all kinds alike). Prints each kind's median and 90th percentile statement time and
# its median over the unfiltered median.
#
#   bench/filtered.sh FILE.parquet [cpu|gpu]     # FILE: `sparse-knn generate --shape nytimes ...`
#
# Knobs: BIN (default target/release/sparse-knn), ROUNDS (default 20), QUERY_ID (the lookup's row,
# default 4242), STATEMENT_LOG (keep the session's statement log there).
set -euo pipefail
FILE=$(realpath "$1")
DEVICE=${2:-cpu}
BIN=${BIN:-$(dirname "$0")/../target/release/sparse-knn}
ROUNDS=${ROUNDS:-20}
QUERY_ID=${QUERY_ID:-4242}
ROWS=$("$BIN" sql -c "SELECT count(*) AS n FROM '$FILE'" 2>/dev/null | grep -oE '[0-9]+' | tail -1)
SQL=$(mktemp --suffix .sql)
LOG=${STATEMENT_LOG:-$(mktemp)}
trap 'rm -f "$SQL"' EXIT
# kind|predicate, {r} the round (each round's predicate a new one; `(id + r) % m` keeps its share).
KINDS=(
    "unfiltered|"
    "50% modulo|(id + {r}) % 2 = 0"
    "10% modulo|(id + {r}) % 10 = 3"
    "1% modulo|(id + {r}) % 100 = 5"
    "0.1% modulo|(id + {r}) % 1000 = 6"
    "0.01% modulo|(id + {r}) % 10000 = 7"
    "50% range|id < $((ROWS / 2)) + {r}"
    "1% range|id BETWEEN $((ROWS / 3)) + {r} AND $((ROWS / 3 + ROWS / 100)) + {r}"
    "0.01% range|id BETWEEN $((ROWS / 5)) + {r} AND $((ROWS / 5 + ROWS / 10000)) + {r}"
)
{
    echo "CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '$FILE';"
    echo "CREATE TABLE q AS SELECT * FROM docs WHERE id = $QUERY_ID;"
    # The build, and two warm lookups before the rounds.
    for _ in 1 2 3; do
        echo "SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=$DEVICE');"
    done
    for r in $(seq 1 "$ROUNDS"); do
        for kind in "${KINDS[@]}"; do
            predicate=${kind#*|}
            if [ -z "$predicate" ]; then
                right=docs
            else
                right="(SELECT * FROM docs WHERE ${predicate//\{r\}/$r})"
            fi
            echo "SELECT max(neighbor_id) FROM knn_join(q, $right, 'cosine', 10, 'device=$DEVICE');"
        done
    done
} > "$SQL"
"$BIN" sql --timing "$SQL" > "$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
echo "$ROWS rows, device=$DEVICE, $ROUNDS rounds; first lookup (read + build): $(grep -- '-- statement 3:' "$LOG" | awk '{print $4}') s"
grep -- '-- statement' "$LOG" | awk '{print $4}' | tail -n +6 | python3 -c '
import statistics, sys
kinds = [k.split("|")[0] for k in sys.argv[1:]]
times = [float(t) for t in sys.stdin.read().split()]
by = {k: sorted(times[i::len(kinds)]) for i, k in enumerate(kinds)}
base = statistics.median(by[kinds[0]])
print("| right side | median ms | p90 ms | median / unfiltered |")
print("|---|---|---|---|")
for k in kinds:
    t = by[k]
    p90 = t[min(len(t) - 1, int(0.9 * len(t)))]
    print(f"| {k} | {statistics.median(t) * 1e3:.1f} | {p90 * 1e3:.1f} | {statistics.median(t) / base:.2f}x |")
' "${KINDS[@]}"
