"""kneighbors against scikit-learn's brute force (n_jobs=-1) on the same sparse matrix.

    python python/bench/bench_kneighbors.py --parquet ../shared/data/kos_bow.parquet
    python python/bench/bench_kneighbors.py --rows 20000 --cols 50000   # generated power-law

Prints, per metric, both timings (best of --repeat), the ratio, how many neighbour lists agree
exactly (ties may legitimately differ) and how many rows have the same k distances (rtol 1e-4).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import scipy.sparse as sp
from sklearn.neighbors import NearestNeighbors

import datafusion_sparse_knn as knn


def load_parquet(path: str) -> sp.csr_matrix:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    vec = next(c for c in table.columns if str(c.type).startswith("struct<indices"))
    vec = vec.combine_chunks()
    indices = vec.field("indices")
    values = vec.field("values")
    indptr = indices.offsets.to_numpy().astype(np.int64)
    dim = int(pc.max(indices.values).as_py()) + 1
    return sp.csr_matrix(
        (values.values.to_numpy().astype(np.float64), indices.values.to_numpy(), indptr),
        shape=(len(table), dim),
    )


def power_law(rows: int, cols: int, mean_degree: int, seed: int) -> sp.csr_matrix:
    """Row degrees and column popularity both heavy-tailed, counts >= 1 (text-like)."""
    rng = np.random.default_rng(seed)
    degrees = np.clip(rng.zipf(1.8, rows) * mean_degree // 3, 1, cols // 4)
    col_weights = 1.0 / np.arange(1, cols + 1) ** 1.1
    col_weights /= col_weights.sum()
    indptr = np.concatenate([[0], np.cumsum(degrees)])
    indices = rng.choice(cols, size=int(indptr[-1]), p=col_weights)
    data = np.floor(rng.pareto(1.5, indptr[-1]) + 1)
    m = sp.csr_matrix((data, indices, indptr), shape=(rows, cols))
    m.sum_duplicates()
    return m


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--parquet", help="a Parquet file with a sparse vector column")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--cols", type=int, default=50000)
    parser.add_argument("--degree", type=int, default=60, help="typical nonzeros per row")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--queries", type=int, default=2000, help="query rows (the first ones); 0 = all")
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--metrics", default="cosine,euclidean,manhattan")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    X = load_parquet(args.parquet) if args.parquet else power_law(args.rows, args.cols, args.degree, args.seed)
    Q = X[: args.queries] if args.queries else X
    source = args.parquet or f"power-law rows={args.rows} cols={args.cols} degree={args.degree} seed={args.seed}"
    print(f"data: {source}: {X.shape[0]} x {X.shape[1]}, {X.nnz} nonzeros; {Q.shape[0]} queries, k={args.k}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs; datafusion-sparse-knn {knn.__version__}")
    print(f"{'metric':<12} {'sparse-knn s':>13} {'sklearn s':>10} {'ratio':>8} {'same lists':>11} {'same dists':>11}")
    for metric in args.metrics.split(","):
        ours_t, (ours_d, ours_i) = best(lambda: knn.kneighbors(Q, X, k=args.k, metric=metric, device="cpu"), args.repeat)
        nn = NearestNeighbors(n_neighbors=args.k, algorithm="brute", metric=metric, n_jobs=-1).fit(X)
        sk_t, (sk_d, sk_i) = best(lambda: nn.kneighbors(Q), args.repeat)
        same = (np.sort(ours_i, axis=1) == np.sort(sk_i, axis=1)).all(axis=1).mean()
        dists = np.isclose(ours_d, sk_d, rtol=1e-4, atol=1e-6).all(axis=1).mean()
        print(f"{metric:<12} {ours_t:>13.3f} {sk_t:>10.3f} {sk_t / ours_t:>7.1f}x {same:>10.1%} {dists:>10.1%}")


if __name__ == "__main__":
    main()
