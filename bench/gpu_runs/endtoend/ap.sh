#!/usr/bin/env bash
# Call AP (two GPUs, 2026-11-26): the segment map's final rule (more than one round of the block
# and more than 64 segments) and knn --profile, with the CPU radius work in progress beside them:
# every GPU test and GPU SQL test on both GPUs; on GPU 0, bench cosine at movielens (and
# manhattan), nytimes and secedgar with the map never (SPARSE_KNN_GPU_SEG_MAP=never) and by the
# rule, alternated; bench on movielens one GPU and two (two rounds); knn Parquet -> Parquet with
# --profile on one GPU and two (wall measured around the process).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
for s in nytimes secedgar; do /tmp/sk_new generate --shape $s --output /tmp/data/$s.parquet 2>&1 | tail -1 | tee -a $W/log.txt; done
for round in 1 2; do for s in movielens nytimes secedgar; do
  m=cosine; [ $s = movielens ] && m=cosine,manhattan
  for rule in never default; do
    echo "bench $s seg_map=$rule round=$round" | tee -a $W/log.txt
    SPARSE_KNN_GPU_SEG_MAP=$rule CUDA_VISIBLE_DEVICES=0 timeout 100 /tmp/sk_new bench --input /tmp/data/$s.parquet --metrics $m --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|rror" | tee -a $W/log.txt
  done
done; done
for round in 1 2; do for vis in 0 0,1; do
  echo "bench movielens visible=$vis round=$round" | tee -a $W/log.txt
  CUDA_VISIBLE_DEVICES=$vis timeout 100 /tmp/sk_new bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
for vis in 0 0,1; do for m in cosine manhattan; do
  python3 - "$vis" "$m" "$f" <<'PY' 2>&1 | tee -a $W/log.txt
import os, subprocess, sys, time
vis, m, f = sys.argv[1:]
env = dict(os.environ, CUDA_VISIBLE_DEVICES=vis)
t = time.time()
p = subprocess.run(["/tmp/sk_new", "knn", "--left", f, "--right", f, "--metric", m, "-k", "10", "--device", "gpu", "--output", "/tmp/data/out.parquet", "--overwrite", "--profile"], env=env, capture_output=True, text=True)
print(f"knn visible={vis} {m}: wall {time.time() - t:.3f} s, rc {p.returncode}")
print(p.stderr.strip()[-3000:])
PY
done; done
timeout 100 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_sql_test.log
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
echo done | tee -a $W/log.txt
