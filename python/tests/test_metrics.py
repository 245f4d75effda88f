"""Every metric that scikit-learn or scipy has, against them in float64, on random raw counts
and on the bundled KOS word counts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.neighbors import NearestNeighbors

import datafusion_sparse_knn as knn
from reference import assert_knn, close, reference_matrix, tolerance

# (our metric name, scikit-learn's name or None where only scipy/numpy has it, options)
METRICS = [
    ("cosine", "cosine", {}),
    ("euclidean", "euclidean", {}),
    ("l2", "l2", {}),
    ("sqeuclidean", "sqeuclidean", {}),
    ("manhattan", "manhattan", {}),
    ("cityblock", "cityblock", {}),
    ("l1", "l1", {}),
    ("chebyshev", "chebyshev", {}),
    ("minkowski", "minkowski", {"p": 3}),
    ("canberra", "canberra", {}),
    ("braycurtis", "braycurtis", {}),
    ("hamming", "hamming", {}),
    ("jaccard", "jaccard", {}),
    ("dice", "dice", {}),
    ("russellrao", "russellrao", {}),
    ("correlation", "correlation", {}),
    ("jensenshannon", None, {}),
    ("hellinger", None, {}),
    ("dot", None, {}),
]

# Names of our aliases in the reference functions.
CANONICAL = {"l2": "euclidean", "cityblock": "cityblock", "l1": "cityblock", "manhattan": "cityblock"}

# Metrics defined on distributions: rows are L1-normalised first (scipy renormalises, we do not).
DISTRIBUTIONS = {"jensenshannon", "hellinger"}


def prepared(metric, X, Y):
    if metric in DISTRIBUTIONS:
        def norm(m):
            return sp.csr_matrix(sp.diags(1.0 / np.asarray(m.sum(axis=1)).ravel()) @ m)
        return norm(X), norm(Y)
    return X, Y


def check(metric, sk_metric, options, X, Y, k):
    X, Y = prepared(metric, X, Y)
    distances, indices = knn.kneighbors(X, Y, k=k, metric=metric, device="cpu", **options)
    Xd, Yd = X.toarray(), Y.toarray()
    ref_name = CANONICAL.get(metric, metric)
    assert_knn(ref_name, distances, indices, Xd, Yd, k, p=options.get("p", 2))
    if sk_metric is not None:
        # scikit-learn's brute force, float64 on the dense matrices (boolean views for its
        # boolean metrics, as it would convert them itself).
        fit, query = (Yd != 0, Xd != 0) if metric in {"jaccard", "dice", "russellrao"} else (Yd, Xd)
        nn = NearestNeighbors(n_neighbors=k, algorithm="brute", metric=sk_metric,
                              p=options.get("p", 2)).fit(fit)
        sk_dist, sk_ind = nn.kneighbors(query)
        ref = reference_matrix(ref_name, Xd, Yd, options.get("p", 2))
        tol = tolerance(ref_name, ref, Xd, Yd)
        rows = np.arange(len(Xd))[:, None]
        assert close(distances, sk_dist, tol[rows, sk_ind]).all(), f"{metric}: != scikit-learn"
        # Same neighbours wherever scikit-learn's k-th distance is not tied with the (k+1)-th.
        agree = (np.sort(indices, axis=1) == np.sort(sk_ind, axis=1)).all(axis=1)
        kth = ref[rows[:, 0], sk_ind[:, -1]]
        beyond = np.sort(ref, axis=1)[:, k] if Yd.shape[0] > k else np.full(len(Xd), np.inf)
        untied = np.abs(beyond - kth) > tol[rows[:, 0], sk_ind[:, -1]]
        assert agree[untied].all(), f"{metric}: other neighbours than scikit-learn's"


@pytest.mark.parametrize(("metric", "sk_metric", "options"), METRICS, ids=[m[0] for m in METRICS])
def test_random_counts(metric, sk_metric, options, counts):
    X, Y = counts
    check(metric, sk_metric, options, X, Y, k=7)


@pytest.mark.parametrize(("metric", "sk_metric", "options"), METRICS, ids=[m[0] for m in METRICS])
def test_kos(metric, sk_metric, options, kos):
    check(metric, sk_metric, options, kos[:30], kos, k=10)


def test_kl_divergence_on_positive_distributions():
    # KL is finite only where the right side covers the left's support: dense positive rows.
    rng = np.random.default_rng(5)
    X = rng.random((12, 30)) + 0.01
    Y = rng.random((50, 30)) + 0.01
    X /= X.sum(axis=1, keepdims=True)
    Y /= Y.sum(axis=1, keepdims=True)
    distances, indices = knn.kneighbors(sp.csr_matrix(X), sp.csr_matrix(Y), k=5,
                                        metric="kl_divergence")
    assert_knn("kl_divergence", distances, indices, X, Y, 5)


def test_sparse_input_against_scikit_learn_sparse(counts):
    # scikit-learn's own sparse path (cosine, euclidean, manhattan), not only its dense one.
    X, Y = counts
    for metric in ("cosine", "euclidean", "manhattan"):
        sk_dist, sk_ind = NearestNeighbors(n_neighbors=5, algorithm="brute", metric=metric) \
            .fit(Y).kneighbors(X)
        distances, indices = knn.kneighbors(X, Y, k=5, metric=metric)
        ref = reference_matrix(CANONICAL.get(metric, metric), X.toarray(), Y.toarray())
        tol = tolerance(CANONICAL.get(metric, metric), ref, X.toarray(), Y.toarray())
        rows = np.arange(X.shape[0])[:, None]
        assert close(distances, sk_dist, tol[rows, sk_ind]).all(), metric
        assert (indices == sk_ind).mean() > 0.9, metric


def test_self_search_includes_each_row(counts):
    X, _ = counts
    distances, indices = knn.kneighbors(X, k=3, metric="cosine")
    sk_dist, sk_ind = NearestNeighbors(n_neighbors=3, algorithm="brute", metric="cosine") \
        .fit(X).kneighbors(X)
    assert (indices[:, 0] == np.arange(X.shape[0])).all()
    assert np.allclose(distances[:, 0], 0.0, atol=1e-6)
    assert np.allclose(distances, sk_dist, atol=1e-5)
    assert (indices == sk_ind).all()


def test_exclude_self(counts):
    X, _ = counts
    with_self = knn.kneighbors(X, k=4, metric="manhattan")
    without = knn.kneighbors(X, k=3, metric="manhattan", exclude_self=True)
    assert (without[1] != np.arange(X.shape[0])[:, None]).all()
    assert np.allclose(without[0], with_self[0][:, 1:])


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "manhattan", "jaccard", "dot"])
def test_radius_neighbors(metric, counts):
    X, Y = counts
    Xd, Yd = X.toarray(), Y.toarray()
    ref_name = CANONICAL.get(metric, metric)
    ref = reference_matrix(ref_name, Xd, Yd)
    tol = tolerance(ref_name, ref, Xd, Yd)
    radius = float(np.quantile(ref, 0.9 if metric == "dot" else 0.1))
    distances, indices = knn.radius_neighbors(X, Y, radius=radius, metric=metric)
    assert distances.dtype == object and indices.dtype == object and len(indices) == X.shape[0]
    if metric != "dot":
        sk_dist, sk_ind = NearestNeighbors(algorithm="brute", metric=metric).fit(
            Yd != 0 if metric == "jaccard" else Yd
        ).radius_neighbors(Xd != 0 if metric == "jaccard" else Xd, radius=radius, sort_results=True)
    for i in range(X.shape[0]):
        within = ref[i] >= radius if metric == "dot" else ref[i] <= radius
        margin = np.abs(ref[i] - radius) <= tol[i]
        got = set(indices[i].tolist())
        # Every clear member is found, nothing clearly outside is.
        assert set(np.flatnonzero(within & ~margin)) <= got, (metric, i)
        assert got <= set(np.flatnonzero(within | margin)), (metric, i)
        assert close(distances[i], ref[i][indices[i]], tol[i][indices[i]]).all()
        order = -distances[i] if metric == "dot" else distances[i]
        assert (np.diff(order) >= -1e-12).all()
        if metric != "dot":
            assert set(sk_ind[i][~margin[sk_ind[i]]].tolist()) <= got
    assert sum(len(r) for r in indices) > 0
