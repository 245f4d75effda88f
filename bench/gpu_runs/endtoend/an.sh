#!/usr/bin/env bash
# Call AN (two GPUs, 2026-11-25): issue 11's 2-GPU figure on the final tree (max_dim on every
# core): bench on movielens (full size), one GPU and two alternated, three rounds; EXPLAIN
# ANALYZE of the self join on both GPUs (per-GPU kernel time); a full debug timeline of a
# two-GPU run; knn Parquet -> Parquet on one GPU and two; the multi-GPU test.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/device.txt"
nproc | tee -a "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for round in 1 2 3; do for vis in 0 0,1; do
  echo "bench movielens visible=$vis round=$round" | tee -a $W/log.txt
  CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
for m in cosine manhattan; do
  timeout 60 /tmp/sk_new sql --table d=$f -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join(d, d, '$m', 10, 'device=gpu')" > $W/explain_analyze_$m.txt 2>&1
done
RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 2 > $W/debug_two.log 2>&1
RUST_LOG=datafusion_sparse_knn=debug CUDA_VISIBLE_DEVICES=0 timeout 60 /tmp/sk_new bench --input $f --metrics cosine --devices gpu -k 10 --repeat 2 > $W/debug_one.log 2>&1
for vis in 0 0,1; do for m in cosine manhattan; do
  python3 - "$vis" "$m" "$f" <<'PY' 2>&1 | tee -a $W/log.txt
import os, subprocess, sys, time
vis, m, f = sys.argv[1:]
env = dict(os.environ, CUDA_VISIBLE_DEVICES=vis)
t = time.time()
p = subprocess.run(["/tmp/sk_new", "knn", "--left", f, "--right", f, "--metric", m, "-k", "10", "--device", "gpu", "--output", "/tmp/data/out.parquet", "--overwrite"], env=env, capture_output=True, text=True)
print(f"knn visible={vis} {m}: wall {time.time() - t:.3f} s, rc {p.returncode}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}")
PY
done; done
timeout 120 /tmp/gpu_test --ignored --test-threads=1 every_gpu_of_the_host replicas_split 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
echo done | tee -a $W/log.txt
