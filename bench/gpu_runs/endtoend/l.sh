#!/usr/bin/env bash
# Call L (final build of the certified/chebyshev work): the GPU tests; every certified metric and
# cosine with `bench`, twice, alternated; chebyshev with call I's build (the union kernels) once;
# `knn` Parquet -> Parquet for chebyshev and cosine in fresh processes.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/w; mkdir -p $W
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader | tee "$W/device.txt"
for f in devbin/*/*.xz; do b=$(basename $f .xz); xz -dc $f > /tmp/$b && chmod +x /tmp/$b; done
L=$W/log.txt
pack() { tar -C /tmp -czf $OUT/l.tgz w; }
timeout 150 /tmp/gpu_test --ignored --test-threads=1 2>&1 | tail -16 | tee $W/gpu_test.log
pack
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet
/tmp/sparse-knn generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
for round in 1 2; do
  for metric in cosine chebyshev minkowski hellinger jensenshannon; do
    echo "bench new $metric round=$round" | tee -a $L
    RUST_LOG=datafusion_sparse_knn=debug timeout 60 /tmp/sparse-knn bench --input $f --metrics $metric --devices gpu -k 10 --repeat 1 > $W/bench_${metric}_$round.log 2>&1
    grep -E "^gpu|rror" $W/bench_${metric}_$round.log | tee -a $L
    grep "certified:" $W/bench_${metric}_$round.log | tail -1 | tee -a $L
  done
  pack
done
ms() { echo $(( $(date +%s%N) / 1000000 )); }
for metric in cosine chebyshev; do
  s=$(ms)
  /tmp/sparse-knn knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out_$metric.parquet --overwrite >/dev/null 2>>$L
  e=$(ms); echo "knn metric=$metric wall_ms=$((e - s))" | tee -a $L
done
pack
echo "bench old (call I build, union kernels) chebyshev" | tee -a $L
s=$(ms)
timeout 240 /tmp/sparse-knn-i bench --input $f --metrics chebyshev --devices gpu -k 10 --repeat 1 2>&1 | grep -E "^gpu|rror" | tee -a $L
e=$(ms); echo "old chebyshev bench wall_ms=$((e - s)) (timeout 240 s)" | tee -a $L
pack
