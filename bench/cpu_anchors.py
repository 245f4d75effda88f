#!/usr/bin/env python3
"""CPU anchors for the CPU backend's benchmark (benches/cpu_knn.rs): scikit-learn brute-force kNN
and sparse_dot_topn top-n, Q queries (the first Q rows) against all rows, k=10; or, with
--radius R (cosine only), every pair at cosine distance <= R: scikit-learn's brute-force
radius_neighbors and sparse_dot_topn's product thresholded at similarity 1 - R (on L2-normalised
rows, top_n large enough to keep every match). Both report their pair counts, which must agree
within a handful (pairs at the boundary, rounded differently: sparse_dot_topn keeps similarity
> 1 - R strictly, scikit-learn distance <= R in float32).

Input is either a Parquet file with a sparse-vector column (struct<indices, values>) or the
synthetic power-law matrix of ../shared/bench/anchors.py (powerlaw_csr), which this script then
writes to Parquet so that the Rust side reads exactly the same data.

    pip install scikit-learn sparse_dot_topn pyarrow scipy
    python3 bench/cpu_anchors.py --synthetic /tmp/powerlaw_50k.parquet --json /tmp/anchors_powerlaw.json
    python3 bench/cpu_anchors.py --parquet ../shared/data/news20_bow.parquet --json /tmp/anchors_news20.json
    python3 bench/cpu_anchors.py --parquet /tmp/powerlaw_50k.parquet --radius 0.5 --json /tmp/anchors_radius.json

Timings are wall seconds of the search call alone (model fit, transposition and normalisation are
done before the clock starts), best of --repeat runs.
"""
import argparse
import importlib.util
import json
import os
import platform
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

K = 10
HERE = os.path.dirname(os.path.abspath(__file__))
ANCHORS = os.path.join(HERE, "..", "..", "shared", "bench", "anchors.py")


def powerlaw_csr(*args, **kwargs):
    """The shared anchors' generator, so the synthetic data is the one the README describes."""
    spec = importlib.util.spec_from_file_location("anchors", ANCHORS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.powerlaw_csr(*args, **kwargs)


def write_parquet(m, path):
    """CSR as the canonical sparse-vector column `vec` (offsets shared by both lists)."""
    offsets = pa.array(m.indptr.astype(np.int32), type=pa.int32())
    indices = pa.ListArray.from_arrays(
        offsets, pa.array(m.indices.astype(np.int32)), type=pa.list_(pa.field("item", pa.int32(), False))
    )
    values = pa.ListArray.from_arrays(
        offsets, pa.array(m.data.astype(np.float32)), type=pa.list_(pa.field("item", pa.float32(), False))
    )
    vec = pa.StructArray.from_arrays(
        [indices, values],
        fields=[
            pa.field("indices", indices.type, False),
            pa.field("values", values.type, False),
        ],
    )
    table = pa.table({"id": pa.array(np.arange(m.shape[0], dtype=np.int64)), "vec": vec})
    pq.write_table(table, path)


def load_parquet(path, column=None):
    t = pq.read_table(path)
    if column is None:
        column = next(f.name for f in t.schema if pa.types.is_struct(f.type))
    col = t.column(column).combine_chunks()
    idx, val = col.field("indices"), col.field("values")
    indptr = np.asarray(idx.offsets).astype(np.int64)
    cols = np.asarray(idx.values, dtype=np.int32)[indptr[0] : indptr[-1]]
    vals = np.asarray(val.values, dtype=np.float32)[indptr[0] : indptr[-1]]
    indptr -= indptr[0]
    ncols = int(cols.max()) + 1 if cols.size else 1
    m = sp.csr_matrix((vals, cols, indptr), shape=(len(col), ncols))
    m.sort_indices()
    return m


def stats(m):
    d = np.diff(m.indptr)
    colpop = np.bincount(m.indices, minlength=m.shape[1])
    return dict(
        rows=m.shape[0],
        cols=m.shape[1],
        nnz=int(m.nnz),
        deg_min=int(d.min()),
        deg_median=float(np.median(d)),
        deg_max=int(d.max()),
        top_column_rows=int(colpop.max()),
    )


def best(f, repeat):
    """Best of `repeat` runs; a run over 20 s is not repeated (its noise is small next to it)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
        if times[-1] > 20:
            break
    return min(times)


def sklearn_knn(B, Aq, metric, repeat):
    from sklearn.neighbors import NearestNeighbors

    nn = NearestNeighbors(n_neighbors=K, algorithm="brute", metric=metric, n_jobs=-1).fit(B)
    return best(lambda: nn.kneighbors(Aq), repeat)


def sklearn_radius(B, Aq, radius, repeat):
    """Brute-force cosine radius search; returns (seconds, pairs)."""
    from sklearn.neighbors import NearestNeighbors

    nn = NearestNeighbors(radius=radius, algorithm="brute", metric="cosine", n_jobs=-1).fit(B)
    out = {}

    def run():
        out["ind"] = nn.radius_neighbors(Aq, radius=radius, return_distance=True)[1]

    s = best(run, repeat)
    return s, int(sum(len(r) for r in out["ind"]))


def topn_radius(B, Aq, radius, threads, repeat):
    """sparse_dot_topn with threshold 1 - R on normalised rows; top_n = every right row, so that
    the threshold alone decides. Returns (seconds, pairs)."""
    from sklearn.preprocessing import normalize
    from sparse_dot_topn import sp_matmul_topn

    # A pair without a common column has cosine distance 1 and is never in the sparse product.
    assert radius < 1, "sparse_dot_topn's radius join needs R < 1 (similarity threshold > 0)"
    Bn = normalize(B.astype(np.float32), norm="l2", axis=1, copy=True)
    An = normalize(Aq.astype(np.float32), norm="l2", axis=1, copy=True)
    BnT = Bn.T.tocsr()
    out = {}

    def run():
        # density only sizes the single-thread path's first allocation (top_n x rows otherwise).
        out["c"] = sp_matmul_topn(
            An, BnT, top_n=Bn.shape[0], threshold=1.0 - radius, density=min(1.0, 1000 / Bn.shape[0]), n_threads=threads
        )

    s = best(run, repeat)
    return s, int(out["c"].nnz)


def topn_cosine(B, Aq, threads, repeat):
    """sparse_dot_topn on rows normalised once (outside the clock): a dot top-n is cosine top-n."""
    from sklearn.preprocessing import normalize
    from sparse_dot_topn import sp_matmul_topn

    Bn = normalize(B.astype(np.float32), norm="l2", axis=1, copy=True)
    An = normalize(Aq.astype(np.float32), norm="l2", axis=1, copy=True)
    BnT = Bn.T.tocsr()
    return best(lambda: sp_matmul_topn(An, BnT, top_n=K, sort=True, n_threads=threads), repeat)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--parquet", help="Parquet file with a sparse-vector column")
    src.add_argument("--synthetic", metavar="OUT.parquet", help="make powerlaw_csr data and write it here")
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--cols", type=int, default=30_000)
    ap.add_argument("--mean-deg", type=float, default=40)
    ap.add_argument("--max-deg", type=int, default=2_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--column", default=None)
    ap.add_argument("-q", "--queries", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--metrics", default="cosine,euclidean,manhattan")
    ap.add_argument("--skip-topn", action="store_true")
    ap.add_argument(
        "--radius", type=float, default=None, help="radius join at cosine distance <= R instead of kNN (cosine only)"
    )
    ap.add_argument(
        "--pair-slack",
        type=int,
        default=None,
        help="radius: how far the two anchors' pair counts may differ (default max(10, 1e-4 x pairs): count data has many pairs exactly at the boundary)",
    )
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    if args.synthetic:
        B = powerlaw_csr(args.rows, args.cols, args.mean_deg, args.max_deg, 1, seed=args.seed)
        write_parquet(B, args.synthetic)
        name, path = "powerlaw", args.synthetic
    else:
        B = load_parquet(args.parquet, args.column)
        name, path = os.path.splitext(os.path.basename(args.parquet))[0], args.parquet
    B = B.astype(np.float32)
    Aq = B[: args.queries]
    st = stats(B)
    print(f"{name}: {json.dumps(st)} (load {time.perf_counter() - t0:.1f}s)", flush=True)

    results = []
    if args.radius is not None:
        metrics = list(filter(None, args.metrics.split(",")))
        assert all(m == "cosine" for m in metrics), "--radius is for cosine only: pass --metrics cosine"
        r = args.radius
        counts = {}
        if metrics:
            s, n = sklearn_radius(B, Aq, r, args.repeat)
            counts["sklearn_brute"] = n
            results.append(dict(system="sklearn_brute", metric="cosine", mode="radius", radius=r, seconds=s, pairs=n))
            print(f"  sklearn brute  cosine r={r:g} {s:8.3f} s  {n} pairs", flush=True)
        if not args.skip_topn:
            s, n = topn_radius(B, Aq, r, args.threads, args.repeat)
            counts["sparse_dot_topn"] = n
            results.append(dict(system="sparse_dot_topn", metric="cosine", mode="radius", radius=r, seconds=s, pairs=n))
            print(f"  sparse_dot_topn cosine r={r:g} {s:8.3f} s  {n} pairs", flush=True)
        if len(counts) == 2:
            a, b = counts.values()
            slack = args.pair_slack if args.pair_slack is not None else max(10, int(1e-4 * max(a, b)))
            assert abs(a - b) <= slack, f"the anchors' pair counts disagree: {counts} (slack {slack})"
    for metric in filter(None, args.metrics.split(",") if args.radius is None else []):
        s = sklearn_knn(B, Aq, metric, args.repeat)
        results.append(dict(system="sklearn_brute", metric=metric, seconds=s))
        print(f"  sklearn brute  {metric:<10} {s:8.3f} s", flush=True)
    if not args.skip_topn and args.radius is None:
        s = topn_cosine(B, Aq, args.threads, args.repeat)
        results.append(dict(system="sparse_dot_topn", metric="cosine", seconds=s))
        print(f"  sparse_dot_topn cosine   {s:8.3f} s", flush=True)

    out = dict(
        dataset=name,
        path=os.path.abspath(path),
        queries=Aq.shape[0],
        k=K,
        radius=args.radius,
        threads=args.threads,
        machine=platform.processor() or platform.machine(),
        stats=st,
        results=results,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
