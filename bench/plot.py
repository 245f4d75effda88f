#!/usr/bin/env python3
"""Bar chart of full self-join seconds per metric and dataset shape: ours against the anchors.

Reads any mix of
  * `sparse-knn bench --json FILE` output (an object with "dataset" and "runs": per metric and
    device, wall_s, kernel_s, queries, rows, projected_full_join_s, error),
  * a log holding `sparse-knn bench`'s printed tables (any file that is not JSON: a device
    call's log.txt, where only a few files come back): each table row is put with the shape
    whose rows and nonzeros it has, named by the log's `generate: SHAPE R rows x C cols, nnz N`
    lines or anchors.py's `SHAPE {"rows": R, ..., "nnz": N}` lines, and
  * `../shared/bench/anchors.py`'s anchors.json (a list of
    [dataset, system, metric, queries, seconds, projected_full_self_join_seconds]),
and draws one panel per dataset shape: metrics along x, one bar per system (ours per device, each
anchor), seconds on a log-scale y axis, written to the PNG (or any format matplotlib knows by the
suffix) given by --out.

    pip install matplotlib
    python3 bench/plot.py bench/results/gpu/2026-11-26-h100/{ours,anchors}_*.json --out /tmp/plot.png
    # label runs of ours yourself (LABEL=FILE), keep some shapes/metrics, add kernel-only bars:
    python3 bench/plot.py before=old_q_ml.json after=new_q_ml.json anchors.json \\
        --shapes movielens --metrics cosine,manhattan --kernel --out /tmp/ml.png

What is plotted (--time full, the default) is the full self-join time in seconds, every row
against every row:
  * ours: wall_s of a run whose queries are all rows (a measured full join), else the run's
    projected_full_join_s (drawn hatched: projected from Q queries); with --kernel, a second bar
    of kernel_s (GPU kernels alone) for the measured full joins only;
  * anchors: their projected full self-join seconds (they time Q queries and scale linearly).
With --time wall, each side's measured seconds as they are (ours wall_s, the anchors' seconds of
their Q queries): only comparable when both timed the same queries.

When several inputs give the same system, shape and metric, a measured full join beats a
projection and otherwise the fastest is kept. cuSPARSE's per-batch names (cusparse_spgemm_b1024)
fold into one system, cusparse_spgemm. A shape is the file name of ours' "dataset" without
directory and suffix (/tmp/data/movielens.parquet -> movielens; generated data "movielens seed 0"
-> movielens) or the anchors' dataset name;
--alias OLD=NEW renames one (e.g. --alias ml=movielens). Runs with an error, NaN times and
anchors that failed ("fails") are left out and listed on stderr.
"""
import argparse
import json
import math
import os
import re
import sys
from collections import OrderedDict

# The order metrics take along x when present (sparse-knn's catalogue order).
METRIC_ORDER = [
    "dot", "cosine", "euclidean", "sqeuclidean", "manhattan", "chebyshev", "minkowski", "canberra",
    "braycurtis", "hamming", "jaccard", "dice", "russellrao", "correlation", "hellinger",
    "jensenshannon", "kl_divergence",
]


def shape_name(dataset, aliases):
    # `sparse-knn bench` labels generated data "SHAPE seed N", files by their path.
    base = re.sub(r" seed \d+$", "", os.path.splitext(os.path.basename(str(dataset)))[0])
    return aliases.get(base, base)


def system_name(system):
    return re.sub(r"^(cusparse_spgemm)_b\d+$", r"\1", system)


class Points:
    """(system, shape, metric) -> (seconds, projected); the better of two entries wins."""

    def __init__(self):
        self.points = OrderedDict()
        self.shape_info = {}
        self.skipped = []
        self.ours = set()  # the systems that are runs of ours

    def add(self, system, shape, metric, seconds, projected):
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            self.skipped.append(f"{system} {shape} {metric}: no time ({seconds})")
            return
        key = (system, shape, metric)
        old = self.points.get(key)
        # A measured full join beats a projection; otherwise the faster one.
        if old is None or (old[1], old[0]) > (projected, seconds):
            self.points[key] = (seconds, projected)


def read_ours(data, label, args, pts):
    shape = shape_name(data["dataset"], args.alias)
    pts.shape_info.setdefault(shape, (data.get("rows"), data.get("nnz")))
    for r in data["runs"]:
        system = f"{label} {r['device']}"
        pts.ours.update([system, f"{system} kernel"])
        if r.get("error"):
            pts.skipped.append(f"{system} {shape} {r['metric']}: error {r['error']}")
            continue
        rows, queries = r.get("rows") or data.get("rows"), r.get("queries")
        full = bool(rows) and queries == rows
        if args.time == "wall":
            pts.add(system, shape, r["metric"], r.get("wall_s"), False)
            if args.kernel and r.get("kernel_s") is not None:
                pts.add(f"{system} kernel", shape, r["metric"], r["kernel_s"], False)
            continue
        if full:
            seconds, projected = r.get("wall_s"), False
        elif r.get("projected_full_join_s") is not None:
            seconds, projected = r["projected_full_join_s"], True
        elif rows and queries:
            seconds, projected = r["wall_s"] * rows / queries, True
        else:
            seconds, projected = None, True
        pts.add(system, shape, r["metric"], seconds, projected)
        # Kernel seconds only of measured full joins: a Q-query run's kernel time includes the
        # right side's one-off work, which linear scaling would multiply.
        if args.kernel and full and r.get("kernel_s") is not None:
            pts.add(f"{system} kernel", shape, r["metric"], r["kernel_s"], False)


def read_anchors(rows, args, pts):
    for row in rows:
        dataset, system, metric, queries, seconds, projected_s = row[:6]
        shape, system = shape_name(dataset, args.alias), system_name(system)
        if metric == "fails":
            pts.skipped.append(f"{system} {shape}: failed")
            continue
        if args.time == "wall":
            pts.add(system, shape, metric, seconds, False)
        else:
            # Projected from `queries`: plain bars all the same (the caption says so).
            pts.add(system, shape, metric, projected_s, False)


def read_bench_log(text, label, args, pts):
    """`sparse-knn bench` tables in a log: `metric M` then `DEVICE rows nnz queries k wall_s
    fixed_s kernel_s peak_MiB pairs/s full_join_s` rows ('-' for none)."""
    shapes = {}
    for m in re.finditer(r"^generate: (\S+) (\d+) rows x \d+ cols, nnz (\d+)", text, re.M):
        shapes[(int(m.group(2)), int(m.group(3)))] = m.group(1)
    for m in re.finditer(r"^(\S+) (\{.*\})", text, re.M):
        try:
            info = json.loads(m.group(2))
            shapes[(int(info["rows"]), int(info["nnz"]))] = m.group(1)
        except (ValueError, KeyError, TypeError):
            pass
    runs = OrderedDict()
    metric = None
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "metric":
            metric = words[1]
        elif metric and len(words) == 11 and words[1].isdigit() and words[2].isdigit():
            rows, nnz = int(words[1]), int(words[2])
            shape = shapes.get((rows, nnz))
            if shape is None:
                pts.skipped.append(f"{label}: a {metric} row of {rows} rows, {nnz} nonzeros names no shape")
                continue
            num = lambda w: None if w == "-" else float(w)
            runs.setdefault(shape, []).append({
                "metric": metric, "device": words[0], "rows": rows, "queries": int(words[3]),
                "wall_s": num(words[5]), "kernel_s": num(words[7]),
                "projected_full_join_s": num(words[10]), "error": None,
            })
    if not runs:
        sys.exit("plot.py: the log holds no `sparse-knn bench` table rows")
    for shape, shape_runs in runs.items():
        read_ours({"dataset": shape, "rows": shape_runs[0]["rows"], "runs": shape_runs}, label, args, pts)


def load(spec, args, pts):
    label, path = "ours", spec
    if "=" in spec and not os.path.exists(spec):
        label, path = spec.split("=", 1)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"plot.py: cannot read {path}: {e}")
    try:
        data = json.loads(text)
    except ValueError:
        return read_bench_log(text, label, args, pts)
    if isinstance(data, dict) and "runs" in data:
        read_ours(data, label, args, pts)
    elif isinstance(data, list) and all(isinstance(r, list) and len(r) >= 6 for r in data):
        read_anchors(data, args, pts)
    else:
        sys.exit(
            f"plot.py: {path} is neither `sparse-knn bench --json` output (an object with \"runs\") "
            "nor anchors.json (a list of [dataset, system, metric, queries, seconds, projected_s])"
        )


def human(s):
    return f"{s:.0f}" if s >= 100 else f"{s:.3g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", metavar="[LABEL=]FILE", help="JSON files (LABEL names ours' runs; default 'ours')")
    ap.add_argument("--out", required=True, help="image to write (PNG by its suffix)")
    ap.add_argument("--time", choices=["full", "wall"], default="full", help="full self-join seconds (default) or measured seconds")
    ap.add_argument("--kernel", action="store_true", help="also ours' GPU kernel seconds alone")
    ap.add_argument("--shapes", help="comma-separated shapes, in panel order (default: all)")
    ap.add_argument("--metrics", help="comma-separated metrics to keep (default: all)")
    ap.add_argument("--alias", action="append", default=[], metavar="OLD=NEW", help="rename a dataset shape")
    ap.add_argument("--no-values", action="store_true", help="leave the seconds off the bars")
    ap.add_argument("--cols", type=int, default=2, help="panels per row (default 2)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    try:
        args.alias = dict(a.split("=", 1) for a in args.alias)
    except ValueError:
        sys.exit("plot.py: --alias takes OLD=NEW")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        sys.exit("plot.py needs matplotlib, which is not installed: pip install matplotlib")

    pts = Points()
    for spec in args.inputs:
        load(spec, args, pts)
    for s in pts.skipped:
        print(f"plot.py: left out {s}", file=sys.stderr)

    keep_metrics = set(args.metrics.split(",")) if args.metrics else None
    points = {k: v for k, v in pts.points.items() if keep_metrics is None or k[2] in keep_metrics}
    shapes = list(OrderedDict.fromkeys(k[1] for k in points))
    if args.shapes:
        wanted = args.shapes.split(",")
        missing = [s for s in wanted if s not in shapes]
        if missing:
            print(f"plot.py: no data for shape(s) {', '.join(missing)}; have {', '.join(shapes)}", file=sys.stderr)
        shapes = [s for s in wanted if s in shapes]
    if not shapes:
        sys.exit("plot.py: nothing to plot")
    # Ours first (in input order), then the anchors in input order.
    points = {k: v for k, v in points.items() if k[1] in shapes}
    systems = list(OrderedDict.fromkeys(k[0] for k in points))
    systems.sort(key=lambda s: s not in pts.ours)
    cmap = plt.get_cmap("tab10")
    colour = {s: cmap(i % 10) for i, s in enumerate(systems)}

    # Panel width from its bar count; wide panels go one to a row.
    bars = max(sum(1 for k in points if k[1] == shape) for shape in shapes)
    panel_w = min(20.0, max(6.5, 1.5 + 0.32 * bars))
    cols = max(1, min(args.cols, len(shapes), int(26 // panel_w)))
    nrows = math.ceil(len(shapes) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(panel_w * cols, 4.6 * nrows), squeeze=False)
    any_projected = False
    for ax, shape in zip(axes.flat, shapes):
        here = {k: v for k, v in points.items() if k[1] == shape}
        metrics = sorted({k[2] for k in here}, key=lambda m: (METRIC_ORDER.index(m) if m in METRIC_ORDER else 99, m))
        present = [s for s in systems if any(k[0] == s for k in here)]
        # Each metric's group holds only the systems that have it, centred on the tick.
        group = {m: [s for s in present if (s, shape, m) in here] for m in metrics}
        width = 0.8 / max(len(g) for g in group.values())
        for system in present:
            xs, ys, hatches = [], [], []
            for j, m in enumerate(metrics):
                v = here.get((system, shape, m))
                if v is None:
                    continue
                xs.append(j + width * (group[m].index(system) - (len(group[m]) - 1) / 2))
                ys.append(v[0])
                hatches.append("//" if v[1] else None)
            bars = ax.bar(xs, ys, width * 0.95, color=colour[system], edgecolor="black", linewidth=0.4)
            for bar, h in zip(bars, hatches):
                if h:
                    bar.set_hatch(h)
                    any_projected = True
            if not args.no_values:
                for x, y in zip(xs, ys):
                    ax.annotate(
                        human(y), (x, y), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=7, rotation=90,
                    )
        ax.set_yscale("log")
        ax.set_xticks(range(len(metrics)))
        ax.set_xticklabels(metrics, rotation=30, ha="right")
        ax.set_xlim(-0.6, len(metrics) - 0.4)
        lo, hi = min(v[0] for v in here.values()), max(v[0] for v in here.values())
        ax.set_ylim(lo / 2, hi * (12 if not args.no_values else 3))
        ax.grid(axis="y", which="major", alpha=0.4)
        rows, nnz = pts.shape_info.get(shape, (None, None))
        sub = f" ({rows:,} rows, nnz {nnz / 1e6:.1f}M)" if rows and nnz else ""
        ax.set_title(f"{shape}{sub}")
        ax.set_ylabel("full self-join s (log)" if args.time == "full" else "seconds (log)")
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")

    handles = [Patch(facecolor=colour[s], edgecolor="black", label=s) for s in systems]
    if any_projected:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="ours, projected from Q queries"))
    # (below the title, when there is one)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.96 if args.title else 1.0),
               ncol=min(len(handles), 6), frameon=False)
    note = (
        "ours: measured full self-join (hatched: projected from a Q-query run); anchors: projected from their Q-query runs"
        if args.time == "full"
        else "measured seconds of each run as is"
    )
    fig.text(0.5, 0.005, note, ha="center", va="bottom", fontsize=8, style="italic")
    if args.title:
        fig.suptitle(args.title, y=0.995)
    fig.tight_layout(rect=(0, 0.03, 1, 0.9 if args.title else 0.93))
    fig.savefig(args.out, dpi=120, bbox_inches="tight")
    print(f"plot.py: wrote {args.out} ({len(shapes)} shapes, {len(systems)} systems)")


if __name__ == "__main__":
    main()
