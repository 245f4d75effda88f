#!/usr/bin/env bash
# Call AV (one GPU, 2026-11-26): the block scans as one inclusive template (the sum's exclusive
# prefix by subtraction again: call AU's first version cost manhattan 1%); NVRTC straight to the
# device's machine code (SPARSE_KNN_GPU_CODE=cubin, chosen by default where the driver cannot
# cache its PTX translation) against PTX with the driver's disk cache warm and cold; old =
# 68c35bc, new = this tree. Both were dropped after this call: the template kept the 0.6% cost
# and the cubin gained nothing (NVRTC shares the driver's disk cache; see BENCHMARKS.md).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
for f in devbin/e2e/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test.log
SPARSE_KNN_GPU_CODE=cubin timeout 120 /tmp/gpu_test --ignored --test-threads=1 every_metric_matches_cpu_small every_metric_matches_cpu_with 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/gpu_test_cubin.log
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sk_new generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $W/log.txt
/tmp/sk_new generate --shape nytimes --rows 2000 --output /tmp/data/small.parquet 2>&1 | tail -1 | tee -a $W/log.txt
# Small jobs: where the kernels' compile and load are most of the time.
python3 -u - <<'PY' 2>&1 | tee $W/code_kinds.txt
import os, subprocess, time, hashlib
small = "/tmp/data/small.parquet"
base = dict(os.environ, RUST_LOG="datafusion_sparse_knn::gpu=debug")
nohome = {k: v for k, v in base.items() if k != "HOME"}
cases = [
    ("ptx, driver cache warm", dict(base, SPARSE_KNN_GPU_CODE="ptx")),
    ("ptx, driver cache off", dict(base, SPARSE_KNN_GPU_CODE="ptx", CUDA_CACHE_DISABLE="1")),
    ("cubin", dict(base, SPARSE_KNN_GPU_CODE="cubin")),
    ("default, driver cache off", dict(base, CUDA_CACHE_DISABLE="1")),
    ("default, no HOME", nohome),
    ("default", base),
]
digests = {}
for rnd in range(3):
    for name, env in cases:
        for m in ("cosine", "manhattan"):
            out = f"/tmp/data/small_{m}.parquet"
            t = time.time()
            p = subprocess.run(["/tmp/sk_new", "knn", "--left", small, "--right", small, "--metric", m, "-k", "5", "--device", "gpu", "--output", out, "--overwrite"], env=env, capture_output=True, text=True)
            wall = time.time() - t
            lines = [l.split("] ", 1)[-1] for l in p.stderr.splitlines() if "NVRTC" in l or "module loaded" in l or "kernels ready" in l]
            import pyarrow.parquet as pq
            tab = pq.read_table(out)
            d = hashlib.sha256(str(tab.to_pydict()).encode()).hexdigest()[:12]
            digests.setdefault(m, set()).add(d)
            print(f"round {rnd + 1} {name:28s} {m:9s} wall {wall:.3f} s rc {p.returncode} out {d} | " + " | ".join(lines))
for m, ds in digests.items():
    print(f"{m}: {len(ds)} distinct outputs over all cases ({'same' if len(ds) == 1 else 'DIFFERENT'})")
PY
for round in 1 2; do for b in old new; do
  echo "bench movielens $b round=$round" | tee -a $W/log.txt
  timeout 100 /tmp/sk_$b bench --input $f --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
done; done
for round in 1 2; do for code in ptx cubin; do for m in cosine manhattan; do
  python3 - "$code" "$m" "$f" "$round" <<'PY' 2>&1 | tee -a $W/log.txt
import os, subprocess, sys, time
code, m, f, rnd = sys.argv[1:]
env = dict(os.environ, SPARSE_KNN_GPU_CODE=code)
t = time.time()
p = subprocess.run(["/tmp/sk_new", "knn", "--left", f, "--right", f, "--metric", m, "-k", "10", "--device", "gpu", "--output", "/tmp/data/out.parquet", "--overwrite", "--profile"], env=env, capture_output=True, text=True)
print(f"knn new code={code} {m} round={rnd}: wall {time.time() - t:.3f} s, rc {p.returncode}")
print("\n".join(l for l in p.stderr.splitlines() if "first pairs" in l or "total" in l or "closed" in l))
PY
done; done; done
echo done | tee -a $W/log.txt
