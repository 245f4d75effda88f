#!/usr/bin/env bash
# Call AU (one GPU, 2026-11-26): the block scans as one template (gpu_test, the segment map on
# every chunk included); knn's plan no longer holds the index past the last pairs (the GPUs are
# closed beside the commit again) and the warm-up starts at the command's start; the CUDA
# driver's own fixed cost to a process (cuda_floor.py). old = 68c35bc, new = this tree.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
python3 -u bench/gpu_runs/endtoend/cuda_floor.py 2>&1 | tee $W/cuda_floor.txt
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
/tmp/sk_new generate --shape nytimes --rows 2000 --output /tmp/data/small.parquet 2>&1 | tail -1 | tee -a $W/log.txt
for b in old new; do
  echo "small knn --profile $b" | tee -a $W/log.txt
  /tmp/sk_$b knn --left /tmp/data/small.parquet --right /tmp/data/small.parquet --metric cosine -k 3 --device gpu --output /tmp/data/small_out.parquet --overwrite --profile 2>&1 | tee -a $W/log.txt
done
for round in 1 2; do for b in old new; do
  echo "bench movielens $b round=$round" | tee -a $W/log.txt
  timeout 100 /tmp/sk_$b bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
for round in 1 2 3; do for b in old new; do for m in cosine manhattan; do
  python3 - "$b" "$m" "$f" "$round" <<'PY' 2>&1 | tee -a $W/log.txt
import subprocess, sys, time
b, m, f, rnd = sys.argv[1:]
t = time.time()
p = subprocess.run([f"/tmp/sk_{b}", "knn", "--left", f, "--right", f, "--metric", m, "-k", "10", "--device", "gpu", "--output", "/tmp/data/out.parquet", "--overwrite", "--profile"], capture_output=True, text=True)
print(f"knn {b} {m} round={rnd}: wall {time.time() - t:.3f} s, rc {p.returncode}")
print(p.stderr.strip()[-2500:])
PY
done; done; done
for b in old new; do
  python3 - "$b" "$f" <<'PY' > $W/timeline_$b.txt 2>&1
import subprocess, sys, time, datetime
b, f = sys.argv[1:]
now = lambda: datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S.%f")
print("process start", now())
p = subprocess.run([f"/tmp/sk_{b}", "knn", "--left", f, "--right", f, "--metric", "cosine", "-k", "10", "--device", "gpu", "--output", "/tmp/data/out.parquet", "--overwrite"], env={"RUST_LOG": "datafusion_sparse_knn=debug", "PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": __import__("os").environ.get("LD_LIBRARY_PATH", "")}, capture_output=True, text=True)
print("process end", now())
print("\n".join(l for l in p.stderr.splitlines() if "probed left rows" not in l and "folded_knn" not in l)[-6000:])
PY
done
echo done | tee -a $W/log.txt
