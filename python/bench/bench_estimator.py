"""The fitted estimator, the kNN graph and pairwise_distances against scikit-learn (and
pynndescent for the graph), on the CPU.

    python python/bench/bench_estimator.py lookups  --rows 100000 --calls 1000
    python python/bench/bench_estimator.py graph    --parquet data/pbmc_facs_counts.parquet
    python python/bench/bench_estimator.py pairwise --parquet data/news20_bow.parquet --queries 1000
    python python/bench/bench_estimator.py pairwise --parquet ../shared/data/news20_bow.parquet \
        --take 10000 --queries 0

lookups:  NearestNeighbors.fit once, then --calls one-row kneighbors calls (rows of the fitted
          matrix, sliced beforehand), against scikit-learn's NearestNeighbors(algorithm='brute')
          fitted on the same matrix doing the same; per-call times and how many answers agree.
graph:    kneighbors_graph(mode='distance') of every row (fit included) against scikit-learn's
          brute force and pynndescent's NNDescent (its recall against the exact graph).
pairwise: pairwise_distances(X[:queries], X) against sklearn.metrics.pairwise_distances
          (--take: X is the file's first rows; --queries 0: all of them).

Timings are the best of --repeat (wall, and CPU of all the process's threads); ours run with
device='cpu', or --device gpu (graph, pairwise).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import scipy.sparse as sp
import sklearn
from sklearn.metrics import pairwise_distances as sk_pairwise_distances
from sklearn.neighbors import NearestNeighbors as SkNearestNeighbors

import datafusion_sparse_knn as knn
from bench_kneighbors import load_parquet, power_law


def best(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def best_cpu(fn, repeat: int):
    """Best wall time, the least CPU time (all threads of the process, user and system) and the
    last result: on a machine shared with other work the CPU time is what the wall time would be
    on one core of one's own."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus), out


def header(X: sp.csr_matrix, what: str) -> None:
    print(f"data: {what}: {X.shape[0]} x {X.shape[1]}, {X.nnz} nonzeros")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs; datafusion-sparse-knn "
        f"{knn.__version__}, scikit-learn {sklearn.__version__}, numpy {np.__version__}"
    )


def data(args) -> tuple[sp.csr_matrix, str]:
    if args.parquet:
        X = load_parquet(args.parquet)
        if args.take:
            return X[: args.take], f"{args.parquet} (its first {args.take} rows)"
        return X, args.parquet
    what = f"power-law rows={args.rows} cols={args.cols} degree={args.degree} seed={args.seed}"
    return power_law(args.rows, args.cols, args.degree, args.seed), what


def lookups(args) -> None:
    X, what = data(args)
    header(X, what)
    rng = np.random.default_rng(0)
    picks = rng.choice(X.shape[0], size=args.calls, replace=False)
    queries = [X[i : i + 1] for i in picks]
    print(f"{args.calls} one-row kneighbors calls, k={args.k}, on a fitted index of {X.shape[0]} rows")
    print(f"{'metric':<10} {'fit ours s':>10} {'fit sk s':>9} {'ours us/call':>13} {'sk us/call':>11} {'ratio':>7} {'same dists':>11}")
    for metric in args.metrics.split(","):
        fit_ours, ours = best(lambda: knn.NearestNeighbors(n_neighbors=args.k, metric=metric, device="cpu").fit(X), 1)
        fit_sk, sk = best(lambda: SkNearestNeighbors(n_neighbors=args.k, metric=metric, algorithm="brute").fit(X), 1)

        def run(nn):
            return [nn.kneighbors(q) for q in queries]

        ours.kneighbors(queries[0])  # first-call costs (thread pools) out of the loop
        sk.kneighbors(queries[0])
        t_ours, got = best(lambda: run(ours), args.repeat)
        t_sk, want = best(lambda: run(sk), args.repeat)
        same = np.mean([np.allclose(g[0], w[0], rtol=1e-4, atol=1e-5) for g, w in zip(got, want)])
        per_ours = t_ours / args.calls * 1e6
        per_sk = t_sk / args.calls * 1e6
        print(
            f"{metric:<10} {fit_ours:>10.3f} {fit_sk:>9.3f} {per_ours:>13.1f} {per_sk:>11.1f} "
            f"{t_sk / t_ours:>6.1f}x {same:>10.1%}"
        )


def recall(approx: np.ndarray, exact: np.ndarray) -> float:
    hits = sum(len(set(a) & set(e)) for a, e in zip(approx, exact))
    return hits / exact.size


def graph(args) -> None:
    X, what = data(args)
    header(X, what)
    k = args.k
    print(f"kneighbors_graph of every row, k={k} (each row's own pair left out), fit included")
    print(f"{'metric':<10} {'ours s':>8} {'sklearn s':>10} {'ratio':>7} {'pynndescent s':>14} {'recall':>7} {'same dists':>11} {'CPU s ours/sklearn':>19}")
    for metric in args.metrics.split(","):
        def ours():
            return knn.NearestNeighbors(n_neighbors=k, metric=metric, device=args.device).fit(X).kneighbors_graph(mode="distance")

        if args.device == "gpu":
            # The process's first GPU call opens the context and loads the kernels: not timed,
            # as pynndescent's first call (numba compiles) is not; printed.
            first, _ = best(ours, 1)
            print(f"{metric}: the process's first GPU graph took {first:.3f} s (not timed below)")

        def sk():
            return SkNearestNeighbors(n_neighbors=k, metric=metric, algorithm="brute", n_jobs=-1).fit(X).kneighbors_graph(mode="distance")

        t_ours, c_ours, g = best_cpu(ours, args.repeat)
        t_sk, c_sk, ref = best_cpu(sk, args.repeat)
        n = X.shape[0]
        d_ours = g.data.reshape(n, k)
        d_ref = ref.data.reshape(n, k)
        same = np.isclose(d_ours, d_ref, rtol=1e-4, atol=1e-5).all(axis=1).mean()
        nnd = ""
        try:
            from pynndescent import NNDescent

            def approx():
                index = NNDescent(X, n_neighbors=k + 1, metric=metric, random_state=0, n_jobs=-1)
                return index.neighbor_graph

            approx()  # numba compiles on the first call: not timed
            t_nnd, (ind, _) = best(approx, args.repeat)
            # Its lists hold each row itself first; the exact lists leave it out.
            ind = [row[row != i][:k] for i, row in enumerate(ind)]
            nnd = f"{t_nnd:>14.3f} {recall(ind, ref.indices.reshape(n, k)):>6.1%}"
        except ImportError:
            nnd = f"{'-':>14} {'-':>7}"
        cpu = f"{c_ours:.3f}/{c_sk:.3f} {c_sk / c_ours:.1f}x"
        print(f"{metric:<10} {t_ours:>8.3f} {t_sk:>10.3f} {t_sk / t_ours:>6.1f}x {nnd} {same:>10.1%} {cpu:>19}")


def pairwise(args) -> None:
    X, what = data(args)
    header(X, what)
    Q = X[: args.queries] if args.queries else X
    print(f"pairwise_distances of {Q.shape[0]} rows against all {X.shape[0]} (dense float64 output)")
    print(f"{'metric':<10} {'ours s':>8} {'sklearn s':>10} {'ratio':>7} {'max rel diff':>13} {'CPU s ours/sklearn':>19}")
    for metric in args.metrics.split(","):
        t_ours, c_ours, got = best_cpu(lambda: knn.pairwise_distances(Q, X, metric=metric, device=args.device), args.repeat)
        t_sk, c_sk, ref = best_cpu(lambda: sk_pairwise_distances(Q, X, metric=metric, n_jobs=-1), args.repeat)
        diff = np.max(np.abs(got - ref) / np.maximum(1.0, np.abs(ref)))
        cpu = f"{c_ours:.3f}/{c_sk:.3f} {c_sk / c_ours:.1f}x"
        print(f"{metric:<10} {t_ours:>8.3f} {t_sk:>10.3f} {t_sk / t_ours:>6.1f}x {diff:>13.2e} {cpu:>19}")
        if args.device == "gpu" and metric in ("cosine", "euclidean"):
            dense_product(Q, X, metric, ref, args.repeat)


def dense_product(Q, X, metric: str, ref, repeat: int) -> None:
    """The same distances from the dense matrix product on the GPU's tensor cores (PyTorch,
    float32 inputs with TF32 allowed, as a user with the dense matrices would write it): the
    rows made dense on the device first (not timed), the product, the distances and the copy
    of the dense float64 output to the host timed."""
    try:
        import torch
    except ImportError:
        print(f"{metric:<10} (no PyTorch: the dense product is not measured)")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")

    def dense(M):
        coo = M.tocoo()
        index = torch.tensor(np.vstack([coo.row, coo.col]), dtype=torch.int64, device=dev)
        values = torch.tensor(coo.data, dtype=torch.float32, device=dev)
        return torch.sparse_coo_tensor(index, values, M.shape).to_dense()

    try:
        A, B = dense(Q), dense(X)
    except RuntimeError as e:  # out of device memory: the dense rows do not fit
        print(f"{metric:<10} dense product: does not fit ({e})")
        return

    def run():
        if metric == "cosine":
            An = A / A.norm(dim=1, keepdim=True).clamp_min(1e-30)
            Bn = B / B.norm(dim=1, keepdim=True).clamp_min(1e-30)
            D = 1.0 - An @ Bn.T
        else:
            D = torch.cdist(A, B, compute_mode="use_mm_for_euclid_dist")
        out = D.double().cpu().numpy()
        torch.cuda.synchronize()
        return out

    run()
    t, got = best(run, repeat)
    diff = np.max(np.abs(got - ref) / np.maximum(1.0, np.abs(ref)))
    print(f"{metric:<10} dense tensor-core product (PyTorch, TF32): {t:.3f} s, max rel diff {diff:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("what", choices=["lookups", "graph", "pairwise"])
    parser.add_argument("--parquet", help="a Parquet file with a sparse vector column")
    parser.add_argument("--take", type=int, default=0, help="only the first rows of --parquet (0 = all)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--cols", type=int, default=50_000)
    parser.add_argument("--degree", type=int, default=60, help="typical nonzeros per row")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--calls", type=int, default=1000, help="lookups: one-row calls")
    parser.add_argument("--queries", type=int, default=1000, help="pairwise: rows of X (0 = all)")
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--metrics", default="cosine,euclidean,manhattan")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"], help="graph, pairwise: where ours run")
    args = parser.parse_args()
    {"lookups": lookups, "graph": graph, "pairwise": pairwise}[args.what](args)


if __name__ == "__main__":
    main()
