#!/usr/bin/env bash
# The same self knn_join on a Ballista cluster of one and of two executors (each --concurrency 1),
# on this machine: one scheduler, executors on local ports, the client `sparse-knn sql --cluster`.
#   bench/cluster_bench.sh            # ROWS=20000 FILES=4 K=10 METRIC=cosine REPEAT=3
# Prints the best wall time of each and the ratio. Needs target/release/sparse-knn.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/sparse-knn}
ROWS=${ROWS:-20000}
FILES=${FILES:-4}
K=${K:-10}
METRIC=${METRIC:-cosine}
REPEAT=${REPEAT:-3}
OUT=${OUT:-$(mktemp -d)}
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

mkdir -p "$OUT/data"
"$BIN" generate --shape nytimes --rows "$ROWS" --seed 0 --output "$OUT/all.parquet" --overwrite
for i in $(seq 0 $((FILES - 1))); do
  "$BIN" sql -c "COPY (SELECT * FROM '$OUT/all.parquet' WHERE id % $FILES = $i ORDER BY id) TO '$OUT/data/part-$i.parquet' STORED AS PARQUET" >/dev/null
done
SQL="SELECT count(*) AS pairs, round(sum(distance), 3) AS total FROM knn_join('$OUT/data', '$OUT/data', '$METRIC', $K)"

wait_port() { for _ in $(seq 1 300); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

run_with() { # $1: executors
  local base=$((56000 + $1 * 100))
  "$BIN" scheduler --bind 127.0.0.1:$base 2>"$OUT/scheduler-$1.log" & PIDS+=($!)
  wait_port $base
  for e in $(seq 1 "$1"); do
    "$BIN" executor --scheduler 127.0.0.1:$base --port $((base + 2 * e)) --grpc-port $((base + 2 * e + 1)) \
      --concurrency 1 --work-dir "$OUT/work-$1-$e" 2>"$OUT/executor-$1-$e.log" & PIDS+=($!)
    wait_port $((base + 2 * e + 1))
  done
  sleep 1
  local best=""
  for r in $(seq 1 "$REPEAT"); do
    local t0 t1 s
    t0=$(date +%s.%N)
    "$BIN" sql --cluster df://127.0.0.1:$base --format csv -c "$SQL" > "$OUT/result-$1.csv"
    t1=$(date +%s.%N)
    s=$(echo "$t1 - $t0" | bc)
    echo "executors=$1 run=$r seconds=$s $(tail -1 "$OUT/result-$1.csv")" >&2
    if [ -z "$best" ] || (( $(echo "$s < $best" | bc) )); then best=$s; fi
  done
  cleanup; PIDS=()
  echo "$best"
}

local_t0=$(date +%s.%N)
"$BIN" sql --format csv -c "$SQL" > "$OUT/result-local.csv"
local_s=$(echo "$(date +%s.%N) - $local_t0" | bc)
one=$(run_with 1)
two=$(run_with 2)
cmp "$OUT/result-local.csv" "$OUT/result-1.csv"
cmp "$OUT/result-local.csv" "$OUT/result-2.csv"
echo "rows=$ROWS files=$FILES k=$K metric=$METRIC"
echo "local (no cluster): ${local_s} s"
echo "1 executor:  ${one} s (best of $REPEAT)"
echo "2 executors: ${two} s (best of $REPEAT)"
echo "speedup 1 -> 2 executors: $(echo "scale=2; $one / $two" | bc)x"
