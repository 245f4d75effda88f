#!/usr/bin/env bash
# Runs on the device machine (see the GPU section of BENCHMARKS.md for how it is called): the GPU tests, the
# same under compute-sanitizer, and/or the benchmark with the anchors on the same Parquet files.
#   scripts/device_run.sh test            # devrun/gpu_test(.gz) --ignored, then memcheck
#   scripts/device_run.sh bench [ROWS...]  # devrun/sparse-knn(.gz) bench + devrun/anchors.py
#   scripts/device_run.sh compare         # devrun/sparse-knn-old against devrun/sparse-knn, same file
#   scripts/device_run.sh e2e             # knn Parquet -> Parquet against bench on the same file
# Logs go to $OUT (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
mode=${1:-test}
shift || true

# NVRTC and the driver: CUDA's own lib folder first, pip's nvrtc as a fallback.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
ls /usr/local/cuda/lib64/libnvrtc* 2>&1 | head -3 | tee -a "$OUT/device.txt"

unpack() {  # devrun/NAME, NAME.gz or NAME.xz (stripped binaries: the carry limit is 64 MiB) -> /tmp/NAME
    if [ -f "devrun/$1.xz" ]; then xz -dc "devrun/$1.xz" >"/tmp/$1" 2>/dev/null || python3 -c "import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "devrun/$1.xz" >"/tmp/$1";
    elif [ -f "devrun/$1.gz" ]; then gunzip -c "devrun/$1.gz" >"/tmp/$1"; else cp "devrun/$1" "/tmp/$1"; fi
    chmod +x "/tmp/$1"
}

if [ "$mode" = test ]; then
    unpack gpu_test
    /tmp/gpu_test --ignored --test-threads=1 2>&1 | tee "$OUT/gpu_test.log"
    echo "gpu_test exit ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
    # Other test binaries with GPU cases (a metric defined in a test; SQL joins with device=gpu).
    for t in custom_metric_test real_counts_test joins_test gpu_sql_test; do
        if ls devrun/$t* >/dev/null 2>&1; then
            unpack $t
            /tmp/$t --include-ignored --test-threads=1 2>&1 | tee -a "$OUT/gpu_test.log"
            echo "$t exit ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
        fi
    done
    # The CLI's GPU cases (the chunked right side), with the binary they drive.
    if ls devrun/cli_test* >/dev/null 2>&1 && ls devrun/sparse-knn* >/dev/null 2>&1; then
        unpack cli_test
        unpack sparse-knn
        SPARSE_KNN_BIN=/tmp/sparse-knn /tmp/cli_test --ignored --test-threads=1 2>&1 | tee -a "$OUT/gpu_test.log"
        echo "cli_test exit ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
    fi
    SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x "$SAN" ]; then
        # The smaller tests: memcheck slows kernels down by orders of magnitude.
        timeout ${SAN_TIMEOUT:-240} "$SAN" --tool memcheck --leak-check no --error-exitcode 3 \
            /tmp/gpu_test --ignored --test-threads=1 every_metric_matches_cpu_small radius_matches_cpu \
            2>&1 | tail -n 200 >"$OUT/memcheck.log"
        echo "memcheck exit ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
        tail -n 5 "$OUT/memcheck.log"
        # Shared-memory races (the top-k buffer, the accumulators, the scans).
        timeout ${RACE_TIMEOUT:-200} "$SAN" --tool racecheck --error-exitcode 3 \
            /tmp/gpu_test --ignored --test-threads=1 every_metric_matches_cpu_small \
            2>&1 | tail -n 200 >"$OUT/racecheck.log"
        echo "racecheck exit ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
        tail -n 5 "$OUT/racecheck.log"
    else
        echo "no compute-sanitizer" | tee -a "$OUT/summary.txt"
    fi
fi

if [ "$mode" = bench ]; then
    # Full self-join (every row queries every row) through SQL for FULL_METRICS, then every metric
    # on the first Q rows (chebyshev's union walk is too slow for the full join of the large sets),
    # then the anchors on the same Parquet files.
    unpack sparse-knn
    K=/tmp/sparse-knn
    DATA=/tmp/data
    J=/tmp/json
    mkdir -p $DATA $J
    FULL_METRICS=${FULL_METRICS:-dot,cosine,euclidean,manhattan,canberra,jensenshannon}
    ALL=dot,cosine,euclidean,sqeuclidean,manhattan,chebyshev,minkowski,canberra,braycurtis,hamming,jaccard,dice,russellrao,correlation,hellinger,jensenshannon,kl_divergence
    Q=${Q:-1024}
    PARQ=""
    for spec in "$@"; do   # shape:rows
        shape=${spec%%:*}; rows=${spec##*:}
        f=$DATA/$shape.parquet
        $K generate --shape "$shape" --rows "$rows" --output "$f" 2>&1 | tail -1 | tee -a "$OUT/bench.log"
        if [ "${SKIP_FULL:-0}" != 1 ]; then
            RUST_LOG=${RUST_LOG:-info} timeout ${BENCH_TIMEOUT:-240} $K bench --input "$f" --metrics "$FULL_METRICS" \
                --devices gpu -k 10 --repeat 2 --json "$J/full_$shape.json" 2>&1 | tee -a "$OUT/bench.log"
        fi
        timeout ${BENCH_TIMEOUT:-240} $K bench --input "$f" --metrics "${Q_METRICS:-$ALL}" --devices gpu -k 10 \
            --queries "$Q" --repeat 2 --json "$J/q_$shape.json" 2>&1 | tee -a "$OUT/bench.log"
        PARQ="$PARQ --parquet $shape=$f"
    done
    tar czf "$OUT/bench_json.tgz" -C $J .
    if [ -f devrun/anchors.py ] && [ -n "$PARQ" ] && [ "${SKIP_ANCHORS:-0}" != 1 ]; then
        PYTHONUNBUFFERED=1 Q=$Q OUT=$OUT timeout ${ANCHOR_TIMEOUT:-300} python3 devrun/anchors.py $PARQ 2>&1 | tee "$OUT/anchors.log" || true
    fi
fi

if [ "$mode" = compare ]; then
    # The old binary against the new on one generated file, alternating so that drift of the
    # machine shows in both; each bench keeps the fastest of its repeats.
    unpack sparse-knn
    unpack sparse-knn-old
    mkdir -p /tmp/data /tmp/json
    f=/tmp/data/${CMP_SHAPE:-movielens}.parquet
    /tmp/sparse-knn generate --shape "${CMP_SHAPE:-movielens}" --rows "${CMP_ROWS:-100000}" --output "$f" 2>&1 \
        | tail -1 | tee -a "$OUT/compare.log"
    for round in 1 2; do
        for b in sparse-knn-old sparse-knn; do
            echo "== $b round $round" | tee -a "$OUT/compare.log"
            timeout ${BENCH_TIMEOUT:-200} /tmp/$b bench --input "$f" \
                --metrics "${CMP_METRICS:-cosine,manhattan,jensenshannon}" --devices gpu -k 10 --repeat 3 \
                --json "/tmp/json/${b}_$round.json" 2>&1 | tee -a "$OUT/compare.log"
        done
    done
    tar czf "$OUT/compare_json.tgz" -C /tmp/json .
fi

if [ "$mode" = big ]; then
    # A right side of more than 2^31 stored entries (BIG_ROWS rows of the scRNA shape, ~1,800
    # entries a row), probed by BIG_QUERIES rows of the same shape on the GPU and on the CPU; the
    # two answers are compared row by row (ranks, neighbours, distances).
    unpack sparse-knn
    K=/tmp/sparse-knn
    mkdir -p /tmp/big
    R=/tmp/big/right.parquet; Lq=/tmp/big/left.parquet
    /usr/bin/time -v $K generate --shape scrna --rows "${BIG_ROWS:-1250000}" --seed 1 --output $R 2>&1 \
        | grep -E "generate:|Maximum resident|Elapsed" | tee -a "$OUT/big.log"
    $K generate --shape scrna --rows "${BIG_QUERIES:-64}" --seed 2 --output $Lq 2>&1 | tail -1 | tee -a "$OUT/big.log"
    ls -la /tmp/big | tee -a "$OUT/big.log"
    for dev in gpu cpu; do
        echo "== $dev" | tee -a "$OUT/big.log"
        [ "${BIG_EXPLAIN:-1}" = 1 ] && /usr/bin/time -v $K sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$Lq', '$R', 'cosine', 10, 'device=$dev')" 2>&1 \
            | grep -oE "KnnJoinExec.*|build_shards=[0-9]+|build_rows=[0-9]+|build_time=[^,]*|kernel_time[a-z0-9_]*=[^,]*|Maximum resident.*|Elapsed.*" \
            | tee -a "$OUT/big.log"
        /usr/bin/time -v $K knn --left $Lq --right $R --metric cosine -k 10 --device $dev \
            --output /tmp/big/out_$dev.parquet 2>&1 | grep -vE "^\s+(Page|Volun|Invol|Swaps|File|Socket|Signals|Minor|Major|Average|Exit|Percent|System|User|Command)" \
            | tee -a "$OUT/big.log"
    done
    $K sql -c "SELECT count(*) AS pairs, sum(CASE WHEN g.neighbor_id = c.neighbor_id THEN 1 ELSE 0 END) AS same_neighbour, \
        max(abs(g.distance - c.distance)) AS max_abs_diff FROM '/tmp/big/out_gpu.parquet' g \
        JOIN '/tmp/big/out_cpu.parquet' c ON g.query_id = c.query_id AND g.rank = c.rank" 2>&1 | tee -a "$OUT/big.log"
fi

if [ "$mode" = gpus ]; then
    # The movielens-shape self join (full size) on GPU 0 alone and on every GPU, alternating,
    # through SQL (read, build, probe, merge), with the per-GPU kernel time of EXPLAIN ANALYZE.
    unpack sparse-knn
    K=/tmp/sparse-knn
    f=/tmp/data/movielens.parquet
    mkdir -p /tmp/data
    [ -f $f ] || $K generate --shape movielens --output $f 2>&1 | tail -1 | tee -a "$OUT/gpus.log"
    all=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
    for round in 1 2; do
        for metric in ${GPUS_METRICS:-cosine manhattan}; do
            for gpus in 0 "$all"; do
                start=$(date +%s%N)
                $K sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$f', '$f', '$metric', 10, 'device=gpu, gpus=$gpus')" \
                    >/tmp/plan.txt 2>&1
                end=$(date +%s%N)
                echo "round=$round metric=$metric gpus=$gpus wall_ms=$(( (end - start) / 1000000 ))" \
                    "$(grep -oE 'build_time=[^,]*|build_shards=[0-9]+|kernel_time[a-z0-9_]*=[^,]*' /tmp/plan.txt | tr '\n' ' ')" \
                    | tee -a "$OUT/gpus.log"
            done
        done
    done
fi

if [ "$mode" = e2e ]; then
    # End to end against the operator's own time: `bench` (the join inside one process, data in
    # memory) and `knn` Parquet -> Parquet (read, convert, upload, join, write) on the same file,
    # twice each, then EXPLAIN ANALYZE of the same join for where the time goes.
    unpack sparse-knn
    K=/tmp/sparse-knn
    f=/tmp/data/${E2E_SHAPE:-movielens}.parquet
    mkdir -p /tmp/data
    [ -f $f ] || $K generate --shape "${E2E_SHAPE:-movielens}" ${E2E_ROWS:+--rows $E2E_ROWS} --output $f 2>&1 | tail -1 | tee -a "$OUT/e2e.log"
    for metric in ${E2E_METRICS:-cosine manhattan}; do
        $K bench --input $f --metrics $metric --devices gpu -k 10 --repeat 2 2>&1 | tail -2 | tee -a "$OUT/e2e.log"
        for round in 1 2; do
            start=$(date +%s%N)
            $K knn --left $f --right $f --metric $metric -k 10 --device gpu --output /tmp/data/out.parquet --overwrite \
                >/dev/null 2>>"$OUT/e2e.log"
            end=$(date +%s%N)
            echo "knn metric=$metric round=$round wall_ms=$(( (end - start) / 1000000 ))" | tee -a "$OUT/e2e.log"
        done
        $K sql -c "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('$f', '$f', '$metric', 10, 'device=gpu')" 2>&1 \
            | grep -oE "[A-Za-z]+Exec|elapsed_compute=[^,]*|[a-z_]*time[a-z0-9_]*=[^,]*|output_rows=[0-9]+|bytes[a-z_]*=[^,]*" \
            | tr '\n' ' ' | tee -a "$OUT/e2e.log"
        echo | tee -a "$OUT/e2e.log"
    done
fi
