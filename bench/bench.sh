#!/usr/bin/env bash
# The benchmarks of BENCHMARKS.md, in one place (modelled on DataFusion's benchmarks/bench.sh).
#
#   bench/bench.sh data [NAME...]      write the datasets (default: those of the cpu suite)
#   bench/bench.sh run SUITE           run a suite: cpu, gpu, lookups, cluster; JSON under RESULTS
#   bench/bench.sh report [RESULTS]    BENCHMARKS.md's generated tables and the plot, from the JSON
#   bench/bench.sh compare OLD NEW     two result folders (or JSON files) side by side
#
# bench/README.md says what each suite runs, its knobs and how each table of BENCHMARKS.md is made.
# Knobs (environment):
#   BIN=target/release/sparse-knn   the binary (built with `cargo build --release` when missing)
#   CPU_KNN=                        the cpu_knn benchmark binary (default: `cargo bench --no-run`)
#   PYTHON=python3                  numpy, scipy, pyarrow, scikit-learn, sparse_dot_topn, matplotlib
#   DATA_DIR=bench/data             datasets;   SHARED=../shared (anchors.py, write_shapes.py, data/)
#   RESULTS=bench/results           a run writes RESULTS/SUITE/RUN_NAME/ (default DATE-DEVICE)
#   ROWS= Q= REPEAT= ...            sizes: see each suite below and bench/README.md
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/release/sparse-knn}
PYTHON=${PYTHON:-python3}
DATA_DIR=${DATA_DIR:-bench/data}
SHARED=${SHARED:-../shared}
RESULTS=${RESULTS:-bench/results}
ANCHORS_PY=${ANCHORS_PY:-$SHARED/bench/anchors.py}

die() { echo "bench.sh: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }

need_bin() {
    if [ ! -x "$BIN" ]; then
        [ "$BIN" = target/release/sparse-knn ] || die "BIN=$BIN is not an executable"
        cargo build --release --bin sparse-knn
    fi
}

# The device a run is named after: the first GPU's model (h100, h200, ...) or cpuN.
device_tag() {
    local gpu
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
    if [ -n "$gpu" ] && [ "${1:-}" != cpu ]; then
        local n model
        n=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
        model=$(echo "$gpu" | grep -oiE '[A-Z][0-9]{2,4}' | head -1 | tr '[:upper:]' '[:lower:]')
        echo "${n}x${model:-gpu}"
    else
        echo "cpu$(nproc)"
    fi
}

# run_dir SUITE: make and print RESULTS/SUITE/RUN_NAME, with meta.json (date, machine, commit).
run_dir() {
    local dir="$RESULTS/$1/${RUN_NAME:-$(date -u +%F)-$(device_tag "$1")}"
    mkdir -p "$dir"
    local gpus cpu commit
    gpus=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | paste -sd';' - || true)
    cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    git diff --quiet HEAD -- src kernels Cargo.toml 2>/dev/null || commit="$commit+changes"
    "$PYTHON" - "$dir/meta.json" "$1" "$gpus" "$cpu" "$commit" "$*" <<'EOF'
import json, os, shlex, sys, time
path, suite, gpus, cpu, commit = sys.argv[1:6]
keys = ["ROWS", "Q", "REPEAT", "RADIUS", "SHAPES", "CPU_DATASETS", "GPU_METRICS", "METRICS_ROWS",
        "E2E_ROWS", "E2E_Q", "LOOKUP_ROWS", "LOOKUP_BATCHES", "FILES", "DEVICE"]
json.dump(dict(suite=suite, date=time.strftime("%Y-%m-%d", time.gmtime()), gpus=gpus or None,
               cpu=cpu, cores=os.cpu_count(), commit=commit,
               command=" ".join(f"{k}={shlex.quote(os.environ[k])}" for k in keys if os.environ.get(k))
               + f" bench/bench.sh run {suite}"),
          open(path, "w"), indent=1)
EOF
    echo "$dir"
}

# ---------------------------------------------------------------------------------------------
# data

# data_path NAME: the file a dataset name stands for (ROWS= scales the generated ones).
data_path() {
    case $1 in
        news20) echo "$SHARED/data/news20_bow.parquet" ;;
        *) echo "$DATA_DIR/$1${ROWS:+_$ROWS}.parquet" ;;
    esac
}

# data_one NAME: write one dataset unless it is there.
#   movielens nytimes scrna secedgar   sparse-knn generate --shape NAME --seed 0 [--rows ROWS]
#   movielens_l1                       movielens with every row normalised to sum 1 (sparse_normalize)
#   powerlaw_deg40 powerlaw_deg60      anchors.py's powerlaw_csr, 50K x 30K (ROWS scales the rows)
#   *_full, *_like                     anchors.py's own shapes, through write_shapes.py
#   news20                             the real 20 Newsgroups bag of words in $SHARED/data
data_one() {
    local name=$1 out
    out=$(data_path "$name")
    if [ -f "$out" ]; then echo "$out exists" >&2; return; fi
    mkdir -p "$DATA_DIR"
    case $name in
        movielens | nytimes | scrna | secedgar)
            need_bin
            "$BIN" generate --shape "$name" --seed 0 ${ROWS:+--rows "$ROWS"} --output "$out" ;;
        movielens_l1)
            need_bin
            data_one movielens
            "$BIN" sql --table m="$(data_path movielens)" \
                -c "COPY (SELECT id, sparse_normalize(vec, 'l1') AS vec FROM m) TO '$out'" >/dev/null ;;
        powerlaw_deg40 | powerlaw_deg60)
            "$PYTHON" bench/cpu_anchors.py --synthetic "$out" --mean-deg "${name#powerlaw_deg}" \
                ${ROWS:+--rows "$ROWS"} --metrics "" --skip-topn ;;
        *_full | *_like)
            local tmp="$DATA_DIR/.write_shapes"
            "$PYTHON" "$SHARED/bench/write_shapes.py" "$tmp" "$name"
            mv "$tmp/$name.parquet" "$out" && rmdir "$tmp" ;;
        news20) die "news20 is read from $out, which is missing" ;;
        *) die "unknown dataset $name" ;;
    esac
    echo "wrote $out" >&2
}

cmd_data() {
    local names=("$@")
    [ ${#names[@]} -gt 0 ] || names=(cpu)
    for n in "${names[@]}"; do
        case $n in
            cpu) for d in ${CPU_DATASETS:-powerlaw_deg40 powerlaw_deg60 news20}; do
                     [ "$d" = news20 ] || data_one "$d"; done
                 ROWS=${METRICS_ROWS:-30000} data_one movielens
                 ROWS=${METRICS_ROWS:-30000} data_one movielens_l1
                 ROWS=${E2E_ROWS:-50000} data_one nytimes ;;
            gpu) for s in ${SHAPES:-secedgar movielens nytimes scrna}; do data_one "$s"; done ;;
            *) data_one "$n" ;;
        esac
    done
}

# ---------------------------------------------------------------------------------------------
# run

# time_json FILE LABEL CMD...: run CMD under /usr/bin/time, append {"label", "wall_s", "max_rss_kb"}
# as one JSON line to FILE (the report reads the lines).
time_json() {
    local file=$1 label=$2; shift 2
    local t
    t=$(mktemp)
    /usr/bin/time -f "%e %M" -o "$t" "$@" >&2
    read -r wall rss <"$t"; rm -f "$t"
    echo "{\"label\": \"$label\", \"wall_s\": $wall, \"max_rss_kb\": $rss}" >>"$file"
    echo "$label: $wall s" >&2
}

cpu_knn_bin() {
    if [ -n "${CPU_KNN:-}" ]; then echo "$CPU_KNN"; return; fi
    local exe
    exe=$(cargo bench --bench cpu_knn --no-run 2>&1 | tee /dev/stderr | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
    [ -x "$exe" ] || die "could not build the cpu_knn benchmark"
    echo "$exe"
}

# cpu: the CPU backend (benches/cpu_knn.rs) against scikit-learn and sparse_dot_topn on the same
# files and queries (kNN, every metric; a cosine radius join), `sparse-knn bench` of the costly
# metrics on MovieLens-shaped ratings and rows normalised to sum 1, and `knn` end to end.
#   CPU_DATASETS="powerlaw_deg40 powerlaw_deg60 news20" Q=2000 REPEAT=3 RADIUS=0.5 (empty: skip)
#   METRICS_ROWS=30000 (0: skip)  E2E_ROWS=50000 (0: skip) E2E_Q=500 (scikit-learn's queries)
suite_cpu() {
    local dir=$1 q=${Q:-2000} repeat=${REPEAT:-3} radius=${RADIUS-0.5} exe
    need_bin
    exe=$(cpu_knn_bin)
    cp "$exe" "$dir/.cpu_knn"   # edits to the tree during the run change nothing
    for name in ${CPU_DATASETS:-powerlaw_deg40 powerlaw_deg60 news20}; do
        [ "$name" = news20 ] || data_one "$name"
        local f
        f=$(data_path "$name")
        say "cpu knn $name"
        "$PYTHON" bench/cpu_anchors.py --parquet "$f" -q "$q" --repeat "$repeat" --json "$dir/anchors_$name.json"
        "$dir/.cpu_knn" --parquet "$f" -q "$q" --repeat "$repeat" --json "$dir/ours_$name.json"
        if [ -n "$radius" ]; then
            say "cpu radius $name"
            "$PYTHON" bench/cpu_anchors.py --parquet "$f" -q "$q" --repeat "$repeat" --metrics cosine \
                --radius "$radius" --json "$dir/anchors_radius_$name.json"
            "$dir/.cpu_knn" --parquet "$f" -q "$q" --repeat "$repeat" --metrics cosine \
                --radius "$radius" --json "$dir/ours_radius_$name.json"
        fi
    done
    rm -f "$dir/.cpu_knn"
    local mrows=${METRICS_ROWS:-30000}
    if [ "$mrows" != 0 ]; then
        for name in movielens movielens_l1; do
            ROWS=$mrows data_one "$name"
            say "cpu metrics $name"
            "$BIN" bench --input "$(ROWS=$mrows data_path "$name")" --devices cpu -k 10 --repeat 2 \
                --metrics cosine,jensenshannon,kl_divergence,hellinger,minkowski \
                --json "$dir/metrics_$name.json" --overwrite
        done
    fi
    local erows=${E2E_ROWS:-50000}
    if [ "$erows" != 0 ]; then
        ROWS=$erows data_one nytimes
        local f
        f=$(ROWS=$erows data_path nytimes)
        for m in cosine manhattan; do
            say "cpu e2e $m"
            time_json "$dir/e2e.jsonl" "knn $m" "$BIN" knn --left "$f" --right "$f" --metric "$m" -k 10 \
                --device cpu --output "$DATA_DIR/.e2e_out.parquet" --overwrite
        done
        rm -f "$DATA_DIR/.e2e_out.parquet"
        "$PYTHON" bench/cpu_anchors.py --parquet "$f" -q "${E2E_Q:-500}" --metrics cosine,manhattan \
            --skip-topn --json "$dir/anchors_e2e.json"
    fi
}

# gpu: on a machine with a CUDA GPU (the device machine: carry a stripped release binary and set
# BIN, and ANCHORS_PY to a copy of anchors.py). For each paper shape at full size: `bench` of
# GPU_METRICS (full self-join, best of 2) and anchors.py on the same file in the same run; at
# movielens, cosine/chebyshev/minkowski and `knn` Parquet -> Parquet three times (fresh
# processes); on a host of several GPUs, one GPU against all.
#   SHAPES="secedgar movielens nytimes scrna" ROWS= (full size) GPU_METRICS=cosine,euclidean,manhattan
suite_gpu() {
    local dir=$1
    need_bin
    command -v nvidia-smi >/dev/null || die "the gpu suite needs a CUDA GPU (nvidia-smi)"
    [ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    for s in ${SHAPES:-secedgar movielens nytimes scrna}; do
        data_one "$s"
        local f
        f=$(data_path "$s")
        say "gpu $s"
        "$BIN" bench --input "$f" --metrics "${GPU_METRICS:-cosine,euclidean,manhattan}" --devices gpu -k 10 \
            --repeat 2 --json "$dir/ours_$s.json" --overwrite
        if [ -f "$ANCHORS_PY" ]; then
            OUT="$dir/.anchors" "$PYTHON" "$ANCHORS_PY" --parquet "$s=$f" && mv "$dir/.anchors/anchors.json" "$dir/anchors_$s.json"
            rm -rf "$dir/.anchors"
        else
            echo "bench.sh: no $ANCHORS_PY: no anchors for $s" >&2
        fi
        if [ "$s" = movielens ]; then
            "$BIN" bench --input "$f" --metrics cosine,chebyshev,minkowski --devices gpu -k 10 --repeat 2 \
                --json "$dir/metrics_$s.json" --overwrite
            for _ in 1 2 3; do
                time_json "$dir/e2e.jsonl" "knn cosine" "$BIN" knn --left "$f" --right "$f" --metric cosine -k 10 \
                    --device gpu --output "$DATA_DIR/.e2e_out.parquet" --overwrite --profile
            done
            rm -f "$DATA_DIR/.e2e_out.parquet"
            local n
            n=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
            if [ "$n" -gt 1 ]; then
                CUDA_VISIBLE_DEVICES=0 "$BIN" bench --input "$f" --metrics cosine,manhattan --devices gpu -k 10 \
                    --repeat 3 --json "$dir/gpus1_$s.json" --overwrite
                "$BIN" bench --input "$f" --metrics cosine,manhattan --devices gpu -k 10 --repeat 3 \
                    --json "$dir/gpus${n}_$s.json" --overwrite
            fi
        fi
    done
}

# lookups: what a service answering small queries against one large right side pays
# (LOOKUP_ROWS rows of LOOKUP_SHAPE, k=10, cosine, DEVICE): the build alone (`sparse-knn index`);
# a fresh process answering one row from the Parquet file and from the index file; one process
# answering 21 one-row lookups (the first builds, the rest reuse); and, in one warm
# `sql --timing` session, each statement's time: 20 one-row lookups, then LOOKUP_BIG rows at once.
#   LOOKUP_SHAPE=nytimes LOOKUP_ROWS=1000000 LOOKUP_BIG=10000 DEVICE=cpu REPEAT=3
#   LOOKUP_CACHE=64GiB: the session's index cache bound (its default, 2 GiB with no memory limit,
#   keeps no right side past 1M nytimes rows)
suite_lookups() {
    local dir=$1 shape=${LOOKUP_SHAPE:-nytimes} rows=${LOOKUP_ROWS:-1000000} device=${DEVICE:-cpu}
    local big=${LOOKUP_BIG:-10000}
    need_bin
    ROWS=$rows data_one "$shape"
    local right one many index
    right=$(ROWS=$rows data_path "$shape")
    one="$DATA_DIR/.lookup_1.parquet" many="$DATA_DIR/.lookup_$big.parquet" index="$DATA_DIR/.lookup.skidx"
    "$BIN" sql --table r="$right" -c "COPY (SELECT * FROM r WHERE id = 12345 % $rows) TO '$one'" >/dev/null
    "$BIN" sql --table r="$right" -c "COPY (SELECT * FROM r ORDER BY id LIMIT $big) TO '$many'" >/dev/null
    local out="$dir/lookups.jsonl" q="SELECT count(*) FROM knn_join(l, r, 'cosine', 10, 'device=$device');"
    local cache="SET sparse_knn.index_cache = '${LOOKUP_CACHE:-64GiB}';"
    time_json "$out" "build: sparse-knn index" "$BIN" index --input "$right" --output "$index" --overwrite
    for _ in $(seq 1 "${REPEAT:-3}"); do
        time_json "$out" "fresh process, 1 row, parquet" "$BIN" sql --table l="$one" --table r="$right" -c "$q"
        time_json "$out" "fresh process, 1 row, index file" "$BIN" sql --table l="$one" --table r="$index" -c "$q"
    done
    local twenty="$cache $q" warm="$cache $q"
    for _ in $(seq 1 20); do twenty="$twenty $q"; done
    time_json "$out" "one process, 21 one-row lookups, parquet" "$BIN" sql --table l="$one" --table r="$right" -c "$twenty"
    for _ in $(seq 1 20); do warm="$warm $q"; done
    for _ in 1 2 3; do warm="$warm ${q//knn_join(l,/knn_join(lb,}"; done
    for right_path in "$right" "$index"; do
        "$BIN" sql --timing --table l="$one" --table lb="$many" --table r="$right_path" -c "$warm" \
            >/dev/null 2>"$dir/.timing"
        "$PYTHON" - "$dir/.timing" "$out" "$right_path" "$big" <<'EOF'
import json, re, statistics, sys
# The first statement is the SET.
times = [float(t) for t in re.findall(r"-- statement \d+: ([\d.]+) s", open(sys.argv[1]).read())][1:]
first, lookups, bigs = times[0], times[1:21], times[21:]
source = "index file" if sys.argv[3].endswith(".skidx") else "parquet"
rec = dict(label=f"warm session, {source}", first_s=first, lookup_median_s=statistics.median(lookups),
           lookup_max_s=max(lookups), big_rows=int(sys.argv[4]), big_best_s=min(bigs),
           big_queries_per_s=int(sys.argv[4]) / min(bigs))
open(sys.argv[2], "a").write(json.dumps(rec) + "\n")
print(rec, file=sys.stderr)
EOF
    done
    rm -f "$one" "$many" "$index" "$dir/.timing"
}

# cluster: the same self knn_join locally and on a Ballista cluster of one and of two executors
# on this machine (bench/cluster_bench.sh).   ROWS=20000 FILES=4 REPEAT=3
suite_cluster() {
    local dir=$1
    need_bin
    BIN=$BIN OUT="$dir/.cluster" bench/cluster_bench.sh | tee "$dir/cluster.txt"
    rm -rf "$dir/.cluster"
    "$PYTHON" - "$dir/cluster.txt" "$dir/cluster.json" "${RAYON_NUM_THREADS:-}" <<'EOF'
import json, re, sys
text = open(sys.argv[1]).read()
num = lambda pat: float(re.search(pat, text).group(1))
json.dump(dict(local_s=num(r"local \(no cluster\): ([\d.]+)"), one_executor_s=num(r"1 executor: +([\d.]+)"),
               two_executors_s=num(r"2 executors: ([\d.]+)"), rayon_threads=sys.argv[3] or None),
          open(sys.argv[2], "w"), indent=1)
EOF
}

cmd_run() {
    local suite=${1:-}
    case $suite in
        cpu | gpu | lookups | cluster) ;;
        *) die "run SUITE: one of cpu, gpu, lookups, cluster" ;;
    esac
    local dir
    dir=$(run_dir "$suite")
    say "results in $dir"
    "suite_$suite" "$dir"
    say "done: $dir"
}

# ---------------------------------------------------------------------------------------------

case ${1:-} in
    data) shift; cmd_data "$@" ;;
    run) shift; cmd_run "$@" ;;
    report) shift; "$PYTHON" bench/report.py report --results "${1:-$RESULTS}" \
        --markdown "${MARKDOWN:-BENCHMARKS.md}" ${PLOT:+--plot "$PLOT"} ;;
    compare) shift; [ $# -eq 2 ] || die "compare OLD NEW"; "$PYTHON" bench/report.py compare "$1" "$2" ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
esac
