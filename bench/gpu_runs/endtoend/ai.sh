#!/usr/bin/env bash
# Call AI (two GPUs, 2026-11-25; issues 11 and 14): each GPU copies its own shard of the right
# side into one batch (at once, not one after the other before the builds), and the build's host
# copies are freed on a thread of their own. Every GPU test on both GPUs; bench on movielens
# (full size), cosine and manhattan, best of 3, one GPU and two, two rounds; EXPLAIN ANALYZE of
# the self join on two GPUs (each GPU's kernel time); then `knn` Parquet -> Parquet against
# bench on one GPU (issue 14 item 5), two rounds.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
nproc | tee -a "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2; do for vis in 0 0,1; do
  echo "bench movielens visible=$vis round=$round" | tee -a $W/log.txt
  CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
for m in cosine manhattan; do
  CUDA_VISIBLE_DEVICES=0,1 timeout 60 /tmp/sk_new sql --table d=$f -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join(d, d, '$m', 10, 'device=gpu')" > $W/explain_analyze_$m.txt 2>&1
done
export CUDA_VISIBLE_DEVICES=0
for round in 1 2; do for m in cosine manhattan; do
  s=$(date +%s.%N); timeout 60 /tmp/sk_new knn --left $f --right $f --metric $m -k 10 --device gpu --output /tmp/data/out.parquet --overwrite > /dev/null 2>&1; e=$(date +%s.%N)
  echo "knn $m round=$round wall $(python3 -c "print(round($e - $s, 3))")" | tee -a $W/log.txt
done; done
timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
unset CUDA_VISIBLE_DEVICES
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
echo done | tee -a $W/log.txt
