#!/usr/bin/env bash
# BENCHMARKS.md "Serving": CLIENTS clients doing one-row lookups against `sparse-knn serve` with
# ROWS nytimes-shaped rows kept, and the same lookups back to back in one `sparse-knn sql`
# process (the baseline of the throughput ratio).
#
#   bench/serve.sh                      # ROWS=1000000 LOOKUPS=2000 CLIENTS=16 DEVICE=cpu
#   ROWS=11000000 CLIENTS=64 DEVICE=gpu bench/serve.sh
#
# Knobs: BIN (default target/release/sparse-knn), WORK (data and logs, default bench/data/serve),
# PORT (default 50061), BASELINE=0 to skip the back-to-back run (an old binary against a new),
# PREPARED=1 to run the lookup as a prepared statement (`... WHERE id = $1`, each client prepares
# it once and binds each lookup's id),
# SETUP (statements the server runs first, e.g. SET datafusion.execution.target_partitions = 4).
# Prints the bench's line (statements/s, p50/p90/p99/max latency), the server's CPU time a lookup
# and the baseline's lookups/s; the server's log is WORK/serve.log.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/sparse-knn}
ROWS=${ROWS:-1000000}
LOOKUPS=${LOOKUPS:-2000}
CLIENTS=${CLIENTS:-16}
DEVICE=${DEVICE:-cpu}
WORK=${WORK:-bench/data/serve}
PORT=${PORT:-50061}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
DOCS="$WORK/nytimes_$ROWS.parquet"
[ -f "$DOCS" ] || "$BIN" generate --shape nytimes --rows "$ROWS" --seed 0 --output "$DOCS"

# The query rows: every (ROWS / LOOKUPS)-th stored row, held in memory by the session; each
# lookup takes one of them as its left side.
STEP=$(( ROWS / LOOKUPS ))
cat > "$WORK/warmup.sql" <<SQL
${SETUP:-}
CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '$DOCS';
CREATE TABLE q AS SELECT * FROM docs WHERE id % $STEP = 1;
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM q WHERE id = 1), docs, 'cosine', 10, 'device=$DEVICE');
SQL
: > "$WORK/lookups.sql"
for i in $(seq 0 $(( LOOKUPS - 1 ))); do
    echo "SELECT max(neighbor_id) FROM knn_join((SELECT * FROM q WHERE id = $(( i * STEP + 1 ))), docs, 'cosine', 10, 'device=$DEVICE');" >> "$WORK/lookups.sql"
done
echo "SELECT max(neighbor_id) FROM knn_join((SELECT * FROM q WHERE id = \$1), docs, 'cosine', 10, 'device=$DEVICE');" > "$WORK/prepared.sql"
seq 1 "$STEP" $(( (LOOKUPS - 1) * STEP + 1 )) > "$WORK/ids.txt"
if [ "${PREPARED:-0}" = 1 ]; then
    STATEMENTS=(--statements "$WORK/prepared.sql" --parameters "$WORK/ids.txt")
else
    STATEMENTS=(--statements "$WORK/lookups.sql")
fi

echo "== serve: $ROWS rows, $LOOKUPS lookups, $CLIENTS clients, device=$DEVICE, prepared=${PREPARED:-0}"
"$BIN" serve --bind "127.0.0.1:$PORT" --allow-path "$WORK" --max-statements "$CLIENTS" \
    "$WORK/warmup.sql" > /dev/null 2> "$WORK/serve.log" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    grep -q "sparse-knn serve: listening on" "$WORK/serve.log" && break
    kill -0 $SERVER 2>/dev/null || { cat "$WORK/serve.log"; exit 1; }
    sleep 0.5
done
grep -q "sparse-knn serve: listening on" "$WORK/serve.log" || { echo "the server did not start"; exit 1; }
# The server's CPU time over the run (user + system clock ticks, /proc/PID/stat fields 14-15),
# per lookup: where the cores of a machine that serves go.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
BEFORE=$(cpu_ticks)
RUST_LOG=warn "$BIN" bench serve --server "grpc://127.0.0.1:$PORT" "${STATEMENTS[@]}" --clients "$CLIENTS"
AFTER=$(cpu_ticks)
echo "server CPU: $(( (AFTER - BEFORE) * 1000 / $(getconf CLK_TCK) )) ms for $LOOKUPS lookups, $(( (AFTER - BEFORE) * 1000000 / $(getconf CLK_TCK) / LOOKUPS )) us a lookup, on $(nproc) cores"
kill $SERVER; wait $SERVER 2>/dev/null || true

[ "${BASELINE:-1}" = 0 ] && exit 0
echo "== the same lookups back to back in one sparse-knn sql process"
"$BIN" sql --timing "$WORK/warmup.sql" "$WORK/lookups.sql" 2>&1 >/dev/null \
    | python3 -c '
import re, sys
times = [float(m[2]) for m in (re.match(r"-- statement (\d+): ([\d.]+) s", l) for l in sys.stdin) if m]
lookups = times[3:]  # after the two CREATEs and the warm-up lookup
print("statements=%d wall_s=%.3f per_s=%.1f p50_ms=%.2f" % (len(lookups), sum(lookups),
      len(lookups) / sum(lookups), sorted(lookups)[len(lookups) // 2] * 1e3))'
