# Shared by the device scripts of calls BA-CD (factored out of them after the runs, the same
# commands: run_tests and unpack_tests from BT-CD's in the 2026-11-26 review): `source
# bench/gpu_runs/endtoend/lib.sh` from the repository root on the device.
# Sets W (the returned folder), puts the device's CUDA libraries on LD_LIBRARY_PATH, records the
# GPU in device.txt and unpacks the carried devbin/k/*.xz binaries into /tmp.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$OUT
for d in /usr/local/cuda/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$W/device.txt"
for f in devbin/k/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done

# alternate SHAPE ROUND METRICS: bench the old and then the new binary on /tmp/SHAPE.parquet
# (best of 2), into bench.log.
alternate() {
  for v in old new; do
    echo "== $1 round $2 $v" | tee -a $W/bench.log
    timeout 100 /tmp/sk_$v bench --input /tmp/$1.parquet --metrics $3 --devices gpu -k 10 --repeat 2 2>&1 | grep -E "^gpu|^metric" | tee -a $W/bench.log
  done
}

# generate SHAPE [generate's options]: the paper shape at full size, seed 0, as /tmp/SHAPE.parquet.
generate() {
  local s=$1; shift
  /tmp/sk_new generate --shape $s --seed 0 --output /tmp/$s.parquet "$@" 2>&1 | tail -1 | tee -a $W/bench.log
}

# run_tests SECONDS BINARY LOG [ARGS...]: the GPU tests of the carried test binary
# /tmp/BINARY (ARGS: its name filters), their outcome lines appended to LOG.
run_tests() {
  local secs=$1 bin=$2 log=$3; shift 3
  timeout $secs /tmp/$bin --ignored --test-threads=1 "$@" 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a $W/$log
}

# gpu_tests: every GPU test of the carried gpu_test binary, into gpu_test.log.
gpu_tests() {
  run_tests 240 gpu_test gpu_test.log
}

# unpack_tests: the test binaries carried in devbin/t, into /tmp.
unpack_tests() {
  for f in devbin/t/*.xz; do b=$(basename $f .xz); xz -T4 -dc $f > /tmp/$b && chmod +x /tmp/$b; done
}
