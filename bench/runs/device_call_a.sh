#!/usr/bin/env bash
# Device call A (2026-11-25): the GPU tests on the build with AVX-512 CPU kernels, coded lists and
# log_positive; then the CPU transcendental metrics, old (6ca2329) against new, on the device
# host's cores (generate --shape movielens --rows 30000, raw ratings and normalised to sum 1).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
for f in devbin/new/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; grep -m1 'model name' /proc/cpuinfo; grep -o -m1 'avx512f' /proc/cpuinfo; } | tee $OUT/device.txt
timeout 240 /tmp/gpu_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee $OUT/gpu_test.log
cd /tmp
/tmp/sk_new generate --shape movielens --rows 30000 --seed 0 --output /tmp/ml30k.parquet > /dev/null 2>&1
/tmp/sk_new sql -c "COPY (SELECT id, sparse_normalize(vec, 'l1') AS vec FROM '/tmp/ml30k.parquet') TO '/tmp/ml30k_l1.parquet' STORED AS PARQUET" > /dev/null 2>&1
for f in ml30k ml30k_l1; do for r in 1 2; do for b in sk_old sk_new; do
  echo "$f round=$r $b: $(timeout 60 /tmp/$b bench --input /tmp/$f.parquet --devices cpu --metrics cosine,jensenshannon,kl_divergence,hellinger,minkowski --repeat 2 -k 10 2>&1 | grep -E '^metric|^cpu' | paste - - | awk '{print $2, $8}' | tr '\n' ' ')" | tee -a $OUT/cpu_bench.log
done; done; done
SPARSE_KNN_CPU_VECTORS=avx2 timeout 60 /tmp/sk_new bench --input /tmp/ml30k_l1.parquet --devices cpu --metrics cosine,jensenshannon --repeat 2 -k 10 2>&1 | grep -E '^metric|^cpu' | paste - - | awk '{print "ml30k_l1 new avx2:", $2, $8}' | tee -a $OUT/cpu_bench.log
