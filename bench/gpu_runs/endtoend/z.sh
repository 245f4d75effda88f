#!/usr/bin/env bash
# Call Z (one GPU, 2026-11-25; issue 14 item 5): what the CLI-only costs of knn (the right side's
# Parquet read, ~0.2 s on 16 cores, and the exit) depend on. The same build as calls X and Y. The
# scan alone through SQL at 1, 4 and 16 partitions; the scan and knn under glibc malloc settings
# (memory kept in the process, huge pages); the exit of a process that did little.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name --format=csv,noheader; ldd --version | head -1; cat /sys/kernel/mm/transparent_hugepage/defrag; } 2>&1 | tee "$W/device.txt"
xz -dc devbin/e2e/sk_new.xz > /tmp/sk && chmod +x /tmp/sk
L=$W/log.txt
mkdir -p /tmp/data; f=/tmp/data/movielens.parquet; s100=/tmp/data/small.parquet
/tmp/sk generate --shape movielens --output $f 2>&1 | tail -1 | tee -a $L
/tmp/sk generate --shape movielens --rows 100 --seed 3 --output $s100 > /dev/null 2>&1
ms() { echo $(( $(date +%s%N) / 1000000 )); }
for p in 1 4 16; do for r in 1 2; do
  s=$(ms); /tmp/sk sql -c "SET datafusion.execution.target_partitions = $p; SELECT sum(sparse_nnz(vec)) FROM '$f'" > /dev/null 2>&1; e=$(ms)
  echo "scan partitions=$p round=$r wall_ms=$((e - s))" | tee -a $L
done; done
T0=""
T1="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295"
T2="glibc.malloc.hugetlb=1"
T3="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295:glibc.malloc.hugetlb=1"
for r in 1 2; do for t in T0 T1 T2 T3; do
  s=$(ms); GLIBC_TUNABLES=${!t} /tmp/sk sql -c "SELECT sum(sparse_nnz(vec)) FROM '$f'" > /dev/null 2>&1; e=$(ms)
  echo "scan tunables=$t round=$r wall_ms=$((e - s))" | tee -a $L
  s=$(ms); GLIBC_TUNABLES=${!t} RUST_LOG=datafusion_sparse_knn=debug /tmp/sk knn --left $f --right $f --metric cosine -k 10 --device gpu --output /tmp/data/out.parquet --overwrite > /tmp/tl.txt 2>&1; e=$(ms)
  echo "knn tunables=$t round=$r wall_ms=$((e - s)) | $(grep -E 'read the right|returned' /tmp/tl.txt | sed 's/.*] //' | tr '\n' ' ')" | tee -a $L
done; done
for r in 1 2 3; do
  s=$(ms); /tmp/sk sql -c "SELECT 1" > /dev/null 2>&1; e=$(ms); echo "sql SELECT 1 wall_ms=$((e - s))" | tee -a $L
  s=$(ms); /tmp/sk knn --left $s100 --right $s100 --metric cosine -k 10 --device gpu --output /tmp/data/o2.parquet --overwrite > /dev/null 2>&1; e=$(ms); echo "knn 100 rows gpu wall_ms=$((e - s))" | tee -a $L
  s=$(ms); /tmp/sk knn --left $s100 --right $s100 --metric cosine -k 10 --device cpu --output /tmp/data/o2.parquet --overwrite > /dev/null 2>&1; e=$(ms); echo "knn 100 rows cpu wall_ms=$((e - s))" | tee -a $L
done
