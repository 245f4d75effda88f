#!/usr/bin/env python3
"""Joins the CPU benchmark's two sides into one Markdown table per dataset.

    python3 bench/cpu_report.py OURS.json ANCHORS.json [OURS.json ANCHORS.json ...]

OURS.json comes from `cargo bench --bench cpu_knn -- --json`, ANCHORS.json from
`bench/cpu_anchors.py --json`, both on the same Parquet file and query count (and, for a radius
join, both run with the same --radius: the table then has each side's pair count too).
"""
import json
import sys


def radius_table(ours, anchors):
    assert ours.get("radius") == anchors.get("radius"), "both sides must use the same radius"
    a = {(r["system"], r["metric"]): r for r in anchors["results"]}
    st = anchors["stats"]
    lines = [
        f"**{anchors['dataset']}**: {st['rows']} rows x {st['cols']} columns, nnz {st['nnz']}; "
        f"{ours['queries']} queries against all rows, radius join at distance <= {ours['radius']:g}",
        "",
        "| metric | ours build s | ours probe s | ours total s | ours pairs | sklearn brute s | sklearn pairs "
        "| sparse_dot_topn s | sparse_dot_topn pairs | sklearn / ours | sparse_dot_topn / ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ours["results"]:
        m = r["metric"]
        sk = a.get(("sklearn_brute", m))
        tn = a.get(("sparse_dot_topn", m))
        secs = lambda v: f"{v['seconds']:.3f}" if v is not None else "–"
        count = lambda v: str(v["pairs"]) if v is not None else "–"
        ratio = lambda v: f"**{v['seconds'] / r['seconds']:.1f}x**" if v is not None else "–"
        lines.append(
            f"| {m} | {r['build_s']:.3f} | {r['probe_s']:.3f} | {r['seconds']:.3f} | {r.get('pairs', '–')} "
            f"| {secs(sk)} | {count(sk)} | {secs(tn)} | {count(tn)} "
            f"| {ratio(sk)} | {ratio(tn)} |"
        )
    return "\n".join(lines)


def table(ours, anchors):
    assert ours["queries"] == anchors["queries"], "both sides must time the same queries"
    if ours.get("radius") is not None or anchors.get("radius") is not None:
        return radius_table(ours, anchors)
    a = {(r["system"], r["metric"]): r["seconds"] for r in anchors["results"]}
    st = anchors["stats"]
    lines = [
        f"**{anchors['dataset']}**: {st['rows']} rows x {st['cols']} columns, nnz {st['nnz']}, "
        f"row degree {st['deg_min']}/{st['deg_median']:g}/{st['deg_max']} (min/median/max), "
        f"most popular column in {st['top_column_rows']} rows; {ours['queries']} queries against all rows, "
        f"k={ours['k']}",
        "",
        "| metric | ours build s | ours probe s | ours total s | sklearn brute s | sparse_dot_topn s "
        "| sklearn / ours | sparse_dot_topn / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in ours["results"]:
        m = r["metric"]
        sk = a.get(("sklearn_brute", m))
        tn = a.get(("sparse_dot_topn", m))
        cell = lambda v: f"{v:.3f}" if v is not None else "–"
        ratio = lambda v: f"**{v / r['seconds']:.1f}x**" if v is not None else "–"
        lines.append(
            f"| {m} | {r['build_s']:.3f} | {r['probe_s']:.3f} | {r['seconds']:.3f} | {cell(sk)} | {cell(tn)} "
            f"| {ratio(sk)} | {ratio(tn)} |"
        )
    return "\n".join(lines)


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    for o, a in zip(args[::2], args[1::2]):
        with open(o) as f:
            ours = json.load(f)
        with open(a) as f:
            anchors = json.load(f)
        print(table(ours, anchors))
        print()


if __name__ == "__main__":
    main()
