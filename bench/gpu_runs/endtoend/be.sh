#!/usr/bin/env bash
# Calls BE and BF (one GPU, 2026-11-26; issue 14 items 0, 5, 6): this session's final kernels
# (27d2767 in BE, BF; b569cd7 in BH, the final tree). For each paper shape at full size (SHAPES), bench --json of cosine, euclidean and
# manhattan (full self joins, best of 2) and anchors.py on the same file in the same call; on
# movielens, knn Parquet -> Parquet with --profile three times beside bench; then the GPU tests
# carried in devbin/t* (the CLI binary put where the CLI test looks for it).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
rm -f /tmp/*_test
for f in devbin/k/*.xz devbin/${TESTS:-none}/*.xz; do [ -f $f ] || continue; b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
for s in ${SHAPES:-movielens nytimes}; do
  /tmp/sk_new generate --shape $s --seed 0 --output /tmp/$s.parquet 2>&1 | tail -1 | tee -a $W/log.txt
  timeout 150 /tmp/sk_new bench --input /tmp/$s.parquet --metrics cosine,euclidean,manhattan --devices gpu -k 10 --repeat 2 --json $W/ours_$s.json 2>&1 | grep -E "^gpu|^metric" | tee -a $W/log.txt
  if [ $s = movielens ]; then
    for r in 1 2 3; do
      /usr/bin/time -f "knn wall %e s" /tmp/sk_new knn --left /tmp/$s.parquet --right /tmp/$s.parquet --metric cosine -k 10 --device gpu --output /tmp/out.parquet --overwrite --profile 2>&1 | tail -14 | tee -a $W/knn.log
    done
  fi
  PYTHONUNBUFFERED=1 OUT=/tmp timeout 150 python3 devbin/k/anchors.py --parquet $s=/tmp/$s.parquet 2>&1 | grep -E "batch|^$s " | tee -a $W/log.txt
  cp /tmp/anchors.json $W/anchors_$s.json 2>/dev/null
done
[ -x /tmp/gpu_sql_test ] && timeout 120 /tmp/gpu_sql_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee $W/tests.log
[ -x /tmp/real_counts_test ] && timeout 150 /tmp/real_counts_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a $W/tests.log
if [ -x /tmp/cli_test ]; then
  mkdir -p /work/main/target/release && cp /tmp/sk_new /work/main/target/release/sparse-knn
  timeout 150 /tmp/cli_test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a $W/tests.log
fi
echo done | tee -a $W/device.txt
