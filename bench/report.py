#!/usr/bin/env python3
"""BENCHMARKS.md's generated tables from `bench/bench.sh run` results, and two result sets compared.

    python3 bench/report.py report --results bench/results --markdown BENCHMARKS.md [--plot PNG]
    python3 bench/report.py compare OLD NEW      # run folders (or single JSON files)
    python3 bench/report.py table NAME RUN_DIR   # print one table

`report` rewrites every block of the Markdown file between
    <!-- bench:NAME [SUITE/RUN] -->  and  <!-- /bench:NAME -->
with the table NAME made from the run folder RESULTS/SUITE/RUN (default: the newest run of the
table's suite, by folder name). Tables: cpu-knn, cpu-metrics-all, cpu-radius, cpu-metrics,
cpu-e2e (suite cpu); gpu-paper, gpu-metrics, gpu-e2e, gpu-gpus, gpu-plot (suite gpu); lookups;
cluster. gpu-plot redraws the plot (bench/plot.py, needs matplotlib) from the same run's JSON.

A run folder holds meta.json (date, machine, commit, command) and the JSON each suite writes:
cpu_knn's `--json` (ours_*.json), bench/cpu_anchors.py's `--json` (anchors_*.json, with stats),
`sparse-knn bench --json` (ours_SHAPE.json and metrics_*.json on the GPU, metrics_*.json on the
CPU), ../shared/bench/anchors.py's anchors.json (anchors_SHAPE.json, a list of rows), and
JSON lines of timed commands (*.jsonl: label, wall_s, max_rss_kb).
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE_OF = {
    "cpu-knn": "cpu", "cpu-metrics-all": "cpu", "cpu-radius": "cpu", "cpu-metrics": "cpu", "cpu-e2e": "cpu",
    "gpu-paper": "gpu", "gpu-metrics": "gpu", "gpu-e2e": "gpu", "gpu-gpus": "gpu", "gpu-plot": "gpu",
    "lookups": "lookups", "cluster": "cluster",
}
METRIC_ORDER = [
    "dot", "cosine", "euclidean", "sqeuclidean", "manhattan", "chebyshev", "minkowski", "canberra",
    "braycurtis", "hamming", "jaccard", "dice", "russellrao", "correlation", "hellinger",
    "jensenshannon", "kl_divergence",
]


def load(path):
    with open(path) as f:
        return json.load(f)


def load_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def s3(v):
    return "–" if v is None else f"{v:.3f}"


def secs(v):
    """Seconds at a useful precision: 3 decimals below 10 s, 1 below 1000, none above."""
    if v is None:
        return "–"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def ratio(a, b):
    if a is None or b is None or b <= 0:
        return "–"
    x = a / b
    return f"**{x:.0f}x**" if x >= 100 else f"**{x:.1f}x**"


def name_of(path, prefix):
    return os.path.splitext(os.path.basename(path))[0][len(prefix):]


def dataset_line(st):
    return f"{st['rows']:,} × {st['cols']:,}, nnz {st['nnz']:,}"


def header(run):
    meta_path = os.path.join(run, "meta.json")
    meta = load(meta_path) if os.path.exists(meta_path) else {}
    machine = meta.get("gpus") or f"{meta.get('cores', '?')} cores, {meta.get('cpu', '?')}"
    root = os.path.dirname(HERE)
    where = os.path.relpath(run, root) if os.path.abspath(run).startswith(root + os.sep) else run
    line = f"_`{where}`: {meta.get('date', '?')}, {machine}, commit {meta.get('commit', '?')}"
    if meta.get("command"):
        line += f"; `{meta['command']}`"
    lines = [line + "._" + (f" _{meta['note']}_" if meta.get("note") else "")]
    return lines + [""]


# --- CPU -------------------------------------------------------------------------------------

def cpu_pairs(run, radius):
    """(name, ours, anchors) for each dataset of a cpu run, kNN or radius."""
    prefix = "ours_radius_" if radius else "ours_"
    out = []
    for path in sorted(glob.glob(os.path.join(run, prefix + "*.json"))):
        name = name_of(path, prefix)
        if not radius and name.startswith("radius_"):
            continue
        anchors = os.path.join(run, ("anchors_radius_" if radius else "anchors_") + name + ".json")
        out.append((name, load(path), load(anchors) if os.path.exists(anchors) else None))
    return out


def table_cpu_knn(run):
    rows = ["| dataset | metric | ours s (build + probe) | scikit-learn brute s | sparse_dot_topn s "
            "| scikit-learn ÷ ours | sparse_dot_topn ÷ ours |", "|---|---|---|---|---|---|---|"]
    queries = None
    for name, ours, anchors in cpu_pairs(run, False):
        a = {(r["system"], r["metric"]): r["seconds"] for r in (anchors or {}).get("results", [])}
        queries = ours["queries"]
        label = f"{name} ({dataset_line(anchors['stats'])})" if anchors else name
        for r in ours["results"]:
            m = r["metric"]
            sk, tn = a.get(("sklearn_brute", m)), a.get(("sparse_dot_topn", m))
            if sk is None and tn is None:
                continue
            rows.append(f"| {label} | {m} | {s3(r['seconds'])} | {s3(sk)} | {s3(tn)} "
                        f"| {ratio(sk, r['seconds'])} | {ratio(tn, r['seconds'])} |")
            label = ""
    return header(run) + [f"{queries} queries (the first rows) against all rows, k = 10, best of the repeats.", ""] + rows


def table_cpu_metrics_all(run):
    pairs = cpu_pairs(run, False)
    names = [n for n, _, _ in pairs]
    by = {n: {r["metric"]: r["seconds"] for r in o["results"]} for n, o, _ in pairs}
    metrics = sorted({m for d in by.values() for m in d}, key=lambda m: METRIC_ORDER.index(m) if m in METRIC_ORDER else 99)
    rows = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for m in metrics:
        cells = []
        for n in names:
            v, c = by[n].get(m), by[n].get("cosine")
            cells.append("–" if v is None else f"{v:.3f}" + (f" ({v / c:.1f}x)" if c and m != "cosine" else ""))
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    return header(run) + ["Seconds (build + probe), in brackets ÷ cosine on the same data.", ""] + rows


def table_cpu_radius(run):
    rows = ["| dataset | radius | pairs (ours / scikit-learn / sparse_dot_topn) | ours s (build + probe) "
            "| scikit-learn s | sparse_dot_topn s | scikit-learn ÷ ours | sparse_dot_topn ÷ ours |",
            "|---|---|---|---|---|---|---|---|"]
    for name, ours, anchors in cpu_pairs(run, True):
        a = {r["system"]: r for r in (anchors or {}).get("results", [])}
        sk, tn = a.get("sklearn_brute"), a.get("sparse_dot_topn")
        for r in ours["results"]:
            count = lambda v: f"{v['pairs']:,}" if v else "–"
            sec = lambda v: v["seconds"] if v else None
            rows.append(f"| {name} | {ours['radius']:g} | {r.get('pairs', 0):,} / {count(sk)} / {count(tn)} "
                        f"| {s3(r['seconds'])} | {s3(sec(sk))} | {s3(sec(tn))} "
                        f"| {ratio(sec(sk), r['seconds'])} | {ratio(sec(tn), r['seconds'])} |")
    return header(run) + rows


def bench_runs(path):
    """metric -> run of a `sparse-knn bench --json` file (the first device)."""
    return {r["metric"]: r for r in load(path)["runs"] if not r.get("error")}


def table_metrics(run, prefix, caption):
    files = sorted(glob.glob(os.path.join(run, prefix + "*.json")))
    if not files:
        return header(run) + ["(no figures in this run)"]
    runs = {name_of(f, prefix): bench_runs(f) for f in files}
    metrics = sorted({m for d in runs.values() for m in d}, key=lambda m: METRIC_ORDER.index(m) if m in METRIC_ORDER else 99)
    rows = ["| data | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    for name, d in runs.items():
        c = d.get("cosine", {}).get("wall_s")
        cells = []
        for m in metrics:
            r = d.get(m)
            if r is None:
                cells.append("–")
                continue
            k = f", kernels {r['kernel_s']:.3f}" if r.get("kernel_s") is not None else ""
            x = f" ({r['wall_s'] / c:.2f}x)" if c and m != "cosine" else ""
            cells.append(f"{r['wall_s']:.3f}{x}" if not k else f"{r['wall_s']:.3f} ({r['kernel_s']:.3f}){x}")
        first = next(iter(d.values()))
        rows.append(f"| {name} ({first['rows']:,} rows, nnz {first['nnz']:,}) | " + " | ".join(cells) + " |")
    return header(run) + [caption, ""] + rows


def table_cpu_e2e(run):
    path = os.path.join(run, "e2e.jsonl")
    if not os.path.exists(path):
        return header(run) + ["(no figures in this run)"]
    lines = load_lines(path)
    anchors_path = os.path.join(run, "anchors_e2e.json")
    anchors = load(anchors_path) if os.path.exists(anchors_path) else None
    a = {r["metric"]: r["seconds"] for r in (anchors or {}).get("results", [])}
    rows = ["| metric | ours: `knn` wall s (whole self-join, Parquet to Parquet) | peak RSS MB "
            "| scikit-learn s, projected to every row (measured queries) | scikit-learn ÷ ours |",
            "|---|---|---|---|---|"]
    for line in lines:
        m = line["label"].split()[-1]
        proj = None
        cell = "–"
        if m in a and anchors:
            proj = a[m] * anchors["stats"]["rows"] / anchors["queries"]
            cell = f"{secs(proj)} ({a[m]:.2f} s for {anchors['queries']})"
        rows.append(f"| {m} | {line['wall_s']:.2f} | {line['max_rss_kb'] / 1000:.0f} | {cell} | {ratio(proj, line['wall_s'])} |")
    data = f" on {dataset_line(anchors['stats'])}" if anchors else ""
    return header(run) + [f"Every row against every row{data}, k = 10; one run each.", ""] + rows


# --- GPU -------------------------------------------------------------------------------------

def gpu_anchors(run, shape):
    """system -> metric -> projected full self-join seconds (cuSPARSE batches folded)."""
    path = os.path.join(run, f"anchors_{shape}.json")
    out = {}
    if os.path.exists(path):
        for row in load(path):
            _, system, metric, _, _, projected = row[:6]
            if metric == "fails":
                continue
            system = re.sub(r"^(cusparse_spgemm)_b\d+$", r"\1", system)
            out.setdefault(system, {})[metric] = projected
    return out


def gpu_shapes(run):
    order = ["secedgar", "movielens", "nytimes", "scrna"]
    shapes = [name_of(f, "ours_") for f in glob.glob(os.path.join(run, "ours_*.json"))]
    return sorted(shapes, key=lambda s: (order.index(s) if s in order else 99, s))


def table_gpu_paper(run):
    rows = ["| shape (rows, nnz) | cosine s (kernels) | cuSPARSE cosine s | ours ÷ cuSPARSE | torch dense TF32 s "
            "| scikit-learn 16 cores cosine s (÷ ours) | euclidean s (÷ cuSPARSE) | manhattan s (÷ scikit-learn) |",
            "|---|---|---|---|---|---|---|---|"]
    for shape in gpu_shapes(run):
        ours = bench_runs(os.path.join(run, f"ours_{shape}.json"))
        a = gpu_anchors(run, shape)
        cus, sk, tf = a.get("cusparse_spgemm", {}), a.get("sklearn_brute_cpu16", {}), a.get("torch_dense_tf32", {})
        c, e, m = ours.get("cosine"), ours.get("euclidean"), ours.get("manhattan")
        w = lambda r: r["wall_s"] if r else None
        first = next(iter(ours.values()))
        kern = f" ({c['kernel_s']:.3f})" if c and c.get("kernel_s") is not None else ""
        rows.append(
            f"| {shape} ({first['rows']:,}, {first['nnz'] / 1e6:.1f}M) | {s3(w(c))}{kern} | {secs(cus.get('cosine'))} "
            f"| {ratio(cus.get('cosine'), w(c))} | {secs(tf.get('cosine'))} "
            f"| {secs(sk.get('cosine'))} ({ratio(sk.get('cosine'), w(c))}) "
            f"| {s3(w(e))} ({ratio(cus.get('euclidean'), w(e))}) | {s3(w(m))} ({ratio(sk.get('manhattan'), w(m))}) |")
    return header(run) + [
        "Full self-join, k = 10, through SQL on in-memory data, build included, best of 2; the anchors "
        "(anchors.py, same file, same run) time 1,024 queries (scikit-learn 256) and are projected to "
        "every row.", ""] + rows


def table_gpu_e2e(run):
    path = os.path.join(run, "e2e.jsonl")
    ours = os.path.join(run, "ours_movielens.json")
    if not os.path.exists(path) or not os.path.exists(ours):
        return header(run) + ["(no figures in this run)"]
    bench = bench_runs(ours)["cosine"]["wall_s"]
    walls = [line["wall_s"] for line in load_lines(path)]
    return header(run) + [
        "| movielens, cosine, k = 10 | seconds | ÷ bench |", "|---|---|---|",
        f"| `bench` (join on in-memory data, warm process, best of 2) | {bench:.3f} | 1 |",
        f"| `knn` Parquet -> Parquet, fresh process ({len(walls)} runs) | {min(walls):.2f}-{max(walls):.2f} "
        f"| {min(walls) / bench:.2f}-{max(walls) / bench:.2f}x |"]


def table_gpu_gpus(run):
    ones = glob.glob(os.path.join(run, "gpus1_*.json"))
    if not ones:
        return header(run) + ["(one GPU in this run)"]
    rows = ["| shape | metric | 1 GPU s | N GPUs s | speed-up |", "|---|---|---|---|---|"]
    for one in ones:
        shape = name_of(one, "gpus1_")
        many = [f for f in glob.glob(os.path.join(run, f"gpus*_{shape}.json")) if f != one][0]
        n = re.search(r"gpus(\d+)_", many).group(1)
        a, b = bench_runs(one), bench_runs(many)
        for m in a:
            rows.append(f"| {shape} | {m} | {a[m]['wall_s']:.3f} | {b[m]['wall_s']:.3f} ({n} GPUs) "
                        f"| {a[m]['wall_s'] / b[m]['wall_s']:.2f}x |")
    return header(run) + rows


def draw_plot(run, out):
    files = sorted(glob.glob(os.path.join(run, "ours_*.json")) + glob.glob(os.path.join(run, "anchors_*.json")))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("report.py: no matplotlib: the plot is left as it is", file=sys.stderr)
        return
    meta_path = os.path.join(run, "meta.json")
    meta = load(meta_path) if os.path.exists(meta_path) else {}
    title = f"{(meta.get('gpus') or '').split(',')[0]} {meta.get('date', '')}".strip()
    subprocess.run([sys.executable, os.path.join(HERE, "plot.py"), *files, "--out", out]
                   + (["--title", title] if title else []), check=True)


def table_gpu_plot(run, plot):
    out = plot or os.path.join(HERE, "plots", "gpu_paper_shapes.png")
    draw_plot(run, out)
    rel = os.path.relpath(out, os.path.dirname(HERE))
    return [f"![ours against the anchors, full self-joins]({rel})"]


# --- lookups, cluster ------------------------------------------------------------------------

def table_lookups(run):
    path = os.path.join(run, "lookups.jsonl")
    if not os.path.exists(path):
        return header(run) + ["(no figures in this run)"]
    by, warm = {}, []
    for line in load_lines(path):
        if "wall_s" in line:
            by.setdefault(line["label"], []).append(line["wall_s"])
        else:
            warm.append(line)
    rows = ["| process | best s | median s | runs |", "|---|---|---|---|"]
    rows += [f"| {label} | {min(v):.3f} | {statistics.median(v):.3f} | {len(v)} |" for label, v in by.items()]
    rows += ["", "One `sparse-knn sql --timing` process, each statement's wall time (planning to last row):", "",
             "| right side | first statement s | one-row lookup, median ms (max) | rows at once | best s | queries/s |",
             "|---|---|---|---|---|---|"]
    rows += [f"| {w['label'].split(', ', 1)[1]} | {w['first_s']:.2f} | {1000 * w['lookup_median_s']:.1f} "
             f"({1000 * w['lookup_max_s']:.1f}) | {w['big_rows']:,} | {w['big_best_s']:.2f} | "
             f"{w['big_queries_per_s']:,.0f} |" for w in warm]
    return header(run) + rows


def table_cluster(run):
    c = load(os.path.join(run, "cluster.json"))
    return header(run) + [
        "| local (no cluster) s | 1 executor s | 2 executors s | 1 → 2 executors |", "|---|---|---|---|",
        f"| {c['local_s']:.2f} | {c['one_executor_s']:.2f} | {c['two_executors_s']:.2f} "
        f"| {c['one_executor_s'] / c['two_executors_s']:.2f}x |"]


TABLES = {
    "cpu-knn": table_cpu_knn, "cpu-metrics-all": table_cpu_metrics_all, "cpu-radius": table_cpu_radius,
    "cpu-metrics": lambda run: table_metrics(run, "metrics_", "`sparse-knn bench --devices cpu`: the whole self-join, "
                                             "wall s (best of 2), in brackets ÷ cosine."),
    "cpu-e2e": table_cpu_e2e,
    "gpu-paper": table_gpu_paper,
    "gpu-metrics": lambda run: table_metrics(run, "metrics_", "Full self-join through `bench`, wall s (kernels), "
                                             "in brackets ÷ cosine."),
    "gpu-e2e": table_gpu_e2e, "gpu-gpus": table_gpu_gpus,
    "lookups": table_lookups, "cluster": table_cluster,
}


def newest_run(results, suite):
    runs = sorted(d for d in glob.glob(os.path.join(results, suite, "*")) if os.path.isdir(d))
    return runs[-1] if runs else None


def report(args):
    with open(args.markdown) as f:
        text = f.read()
    pattern = re.compile(r"(<!-- bench:([\w-]+)(?: (\S+))? -->\n)(.*?)(<!-- /bench:\2 -->)", re.S)
    done = []

    def redo(m):
        name, pin = m.group(2), m.group(3)
        if name not in SUITE_OF:
            sys.exit(f"report.py: unknown table {name}")
        run = os.path.join(args.results, pin) if pin else newest_run(args.results, SUITE_OF[name])
        if not run or not os.path.isdir(run):
            print(f"report.py: no run for {name} ({pin or SUITE_OF[name]}): left as it is", file=sys.stderr)
            return m.group(0)
        body = table_gpu_plot(run, args.plot) if name == "gpu-plot" else TABLES[name](run)
        done.append(f"{name} <- {run}")
        return m.group(1) + "\n".join(body) + "\n" + m.group(5)

    text = pattern.sub(redo, text)
    with open(args.markdown, "w") as f:
        f.write(text)
    for d in done:
        print(f"report.py: {d}")


# --- compare ---------------------------------------------------------------------------------

def figures(path):
    """(file, what) -> seconds for every figure of a run folder or one JSON file."""
    out = {}
    files = [path] if os.path.isfile(path) else sorted(glob.glob(os.path.join(path, "*.json*")))
    for f in files:
        base = os.path.basename(f)
        if base == "meta.json":
            continue
        if f.endswith(".jsonl"):
            for line in load_lines(f):
                key = (base, line["label"])
                out[key] = min(out.get(key, float("inf")), line["wall_s"])
            continue
        data = load(f)
        if isinstance(data, list):  # anchors.py
            for row in data:
                if row[2] != "fails":
                    out[(base, f"{row[1]} {row[2]} (projected)")] = row[5]
        elif "runs" in data:  # sparse-knn bench
            for r in data["runs"]:
                if not r.get("error"):
                    out[(base, f"{r['metric']} {r['device']}")] = r["wall_s"]
        elif "results" in data:  # cpu_knn or cpu_anchors
            for r in data["results"]:
                out[(base, f"{r.get('system', 'ours')} {r['metric']}")] = r["seconds"]
        elif base == "cluster.json":
            for k, v in data.items():
                if isinstance(v, float):
                    out[(base, k)] = v
    return out


def compare(args):
    old, new = figures(args.old), figures(args.new)
    print(f"| file | figure | {args.old} s | {args.new} s | new ÷ old |")
    print("|---|---|---|---|---|")
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        r = f"{b / a:.2f}" if a and b else "–"
        print(f"| {key[0]} | {key[1]} | {secs(a)} | {secs(b)} | {r} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report")
    r.add_argument("--results", default=os.path.join(HERE, "results"))
    r.add_argument("--markdown", default=os.path.join(HERE, "..", "BENCHMARKS.md"))
    r.add_argument("--plot", default=None, help="the plot's file (default bench/plots/gpu_paper_shapes.png)")
    c = sub.add_parser("compare")
    c.add_argument("old")
    c.add_argument("new")
    t = sub.add_parser("table")
    t.add_argument("name", choices=sorted(TABLES))
    t.add_argument("run")
    args = ap.parse_args()
    if args.cmd == "report":
        report(args)
    elif args.cmd == "compare":
        compare(args)
    else:
        print("\n".join(TABLES[args.name](args.run)))


if __name__ == "__main__":
    main()
