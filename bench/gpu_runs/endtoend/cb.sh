#!/usr/bin/env bash
# Call CB (issue 14 item 5): the same Parquet -> Parquet job in a fresh process and in a warm one.
# bench's cosine on movielens (best of 3); `knn` twice as fresh processes (the process's wall and
# knn's own total); then one `sql` process running COPY (knn_join) TO Parquet three times, each
# statement's time from its debug line (the first pays the driver and the context, the others
# find them warm), with the join's read and build stamps.
source bench/gpu_runs/endtoend/lib.sh
generate movielens
timeout 60 /tmp/sk_new bench --input /tmp/movielens.parquet --metrics cosine --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
for r in 1 2; do
  echo "== knn round $r" | tee -a $W/knn.log
  /usr/bin/time -f "knn wall %e s" /tmp/sk_new knn --left /tmp/movielens.parquet --right /tmp/movielens.parquet --metric cosine -k 10 --device gpu --output /tmp/out.parquet --overwrite --profile 2>&1 | grep -E "wall|total|first pairs|closed|^knn:" | tee -a $W/knn.log
done
Q="COPY (SELECT * FROM knn_join(m, m, 'cosine', 10, 'device=gpu')) TO '/tmp/o.parquet'"
for r in 1 2; do
  echo "== sql process $r" | tee -a $W/sql.log
  { echo "process start $(date +%H:%M:%S.%N)"; RUST_LOG=datafusion_sparse_knn=debug /usr/bin/time -f "sql wall %e s" /tmp/sk_new sql --table m=/tmp/movielens.parquet -c "$Q" -c "$Q" -c "$Q" -c "SELECT count(*) AS n, sum(query_id * 1000003 + neighbor_id * rank) AS ids FROM '/tmp/o.parquet'" 2>&1; echo "process end $(date +%H:%M:%S.%N)"; } | grep -E "process|sql:|read the right|built the right|ready|wall|^\| [0-9]" | cut -c1-220 | tee -a $W/sql.log
done
/tmp/sk_new sql -c "SELECT count(*) AS n, sum(query_id * 1000003 + neighbor_id * rank) AS ids FROM '/tmp/out.parquet'" 2>&1 | tail -2 | head -1 | tee -a $W/sql.log
echo done | tee -a $W/device.txt
