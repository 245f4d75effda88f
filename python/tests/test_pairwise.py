"""pairwise_distances against scikit-learn's on raw counts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import pairwise_distances as sk_pairwise_distances

import datafusion_sparse_knn as knn
from reference import EXPANDED, close, tolerance

# What sklearn.metrics.pairwise_distances computes on sparse input.
SPARSE_METRICS = ["cosine", "euclidean", "manhattan"]
# Through scipy's cdist, on dense input (the set metrics on the nonzero view).
DENSE_METRICS = [
    "chebyshev", "braycurtis", "canberra", "sqeuclidean", "correlation", "hamming",
    "jaccard", "dice", "russellrao",
]


def sparse_tolerance(metric, ref, X, Y):
    tol = 1e-4 * np.maximum(1.0, np.abs(ref))
    if metric in EXPANDED:
        sq_x = np.asarray(X.multiply(X).sum(axis=1)).reshape(-1, 1)
        sq_y = np.asarray(Y.multiply(Y).sum(axis=1)).reshape(1, -1)
        tol = np.maximum(tol, 1e-3 * np.sqrt(sq_x + sq_y))
    return tol


@pytest.mark.parametrize("metric", SPARSE_METRICS)
def test_sparse_metrics_on_news20(news20, metric):
    X, Y = news20[:150], news20[150:450]
    got = knn.pairwise_distances(X, Y, metric=metric)
    ref = sk_pairwise_distances(X, Y, metric=metric)
    assert got.shape == (150, 300) and got.dtype == np.float64 and got.flags.writeable
    assert close(got, ref, sparse_tolerance(metric, ref, X, Y)).all(), metric
    # Y=None: X against itself, the diagonal included.
    got = knn.pairwise_distances(X, metric=metric)
    ref = sk_pairwise_distances(X, metric=metric)
    assert got.shape == (150, 150)
    assert close(got, ref, sparse_tolerance(metric, ref, X, X)).all(), metric
    assert np.abs(np.diag(got)).max() <= 1e-3 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("metric", DENSE_METRICS)
def test_scipy_metrics_on_kos(kos, metric):
    X, Y = kos[:60].toarray(), kos[60:200].toarray()
    got = knn.pairwise_distances(X, Y, metric=metric)
    if metric in ("jaccard", "dice", "russellrao"):
        ref = sk_pairwise_distances(X != 0, Y != 0, metric=metric)
    else:
        ref = sk_pairwise_distances(X, Y, metric=metric)
    assert got.shape == ref.shape == (60, 140)
    assert close(got, ref, tolerance(metric, ref, X, Y)).all(), metric


def test_minkowski_and_sparse_input_agree_with_dense(kos):
    X, Y = kos[:40], kos[40:120]
    got = knn.pairwise_distances(X, Y, metric="minkowski", p=3)
    ref = sk_pairwise_distances(X.toarray(), Y.toarray(), metric="minkowski", p=3)
    assert close(got, ref, tolerance("minkowski", ref, X.toarray(), Y.toarray())).all()
    # The same values from every input kind.
    assert np.array_equal(knn.pairwise_distances(X.toarray(), Y.tocsc(), metric="minkowski", p=3), got)


def test_blocks_cover_every_row(kos):
    # More rows than one block holds (4M pairs / 300 rows searched = 13,981 rows a block): a
    # query of 15,000 rows (the cut repeated) comes out whole, each block in its place.
    X = sp.vstack([kos] * 50).tocsr()
    got = knn.pairwise_distances(X, kos, metric="cosine")
    assert got.shape == (15000, 300) and not np.isnan(got).any()
    first = got[:300]
    for b in range(1, 50):
        assert np.array_equal(got[b * 300:(b + 1) * 300], first)


def test_too_large_an_output_is_refused_before_any_work():
    X = sp.csr_matrix((3_000_000, 10))
    with pytest.raises(ValueError, match=r"3000000 x 3000000 float64 values, would take [0-9.]+ GiB"):
        knn.pairwise_distances(X, metric="euclidean")


def test_dot_is_the_dot_product(counts):
    X, Y = counts
    got = knn.pairwise_distances(X, Y, metric="dot")
    ref = (X @ Y.T).toarray()
    np.testing.assert_allclose(got, ref, rtol=1e-5)


# The metrics whose blocks the CPU fills directly (the folded ones), and those whose distances
# come from union terms, which a fitted index probes within an infinite radius.
FOLDED_METRICS = [
    "dot", "cosine", "euclidean", "sqeuclidean", "manhattan", "canberra", "braycurtis",
    "hamming", "jaccard", "dice", "russellrao", "correlation", "kl_divergence",
]
UNION_METRICS = ["chebyshev", "minkowski", "hellinger", "jensenshannon"]


def _matrix_and_reference(metric, X, Y):
    """The index's distance matrix (the backend's own operation: the CPU's dense blocks for the
    folded metrics, a probe within an infinite radius for the rest) and a float64 reference."""
    from reference import reference_matrix
    from sklearn.preprocessing import normalize

    if metric == "jensenshannon":
        # Defined on distributions: scipy renormalises each row, the crate does not.
        X, Y = normalize(X, norm="l1"), normalize(Y, norm="l1")
    got = knn.pairwise_distances(X, Y, metric=metric, device="cpu")
    return got, reference_matrix(metric, X.toarray(), Y.toarray())


@pytest.mark.parametrize("metric", FOLDED_METRICS + UNION_METRICS)
def test_the_distance_matrix_matches_a_float64_reference(kos, metric):
    X, Y = kos[:50], kos[50:250]
    got, want = _matrix_and_reference(metric, X, Y)
    assert got.shape == (50, 200) and got.flags.c_contiguous and got.dtype == np.float64
    ok = close(got, want, tolerance(metric, want, X.toarray(), Y.toarray()))
    ok |= np.isnan(got) & np.isnan(want)
    assert ok.all(), (metric, np.argwhere(~ok)[:5])


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "manhattan", "dot", "kl_divergence"])
def test_rows_against_themselves(kos, metric):
    # Y=None (or Y is X): each pair computed once and mirrored, for a symmetric metric. Word
    # counts are integers, so every sum is exact and a pair gives the same bits from either
    # side: the block equals the one of a copy of the rows (computed row by row, both ways).
    X = kos[:220]
    got = knn.pairwise_distances(X, metric=metric)
    assert np.array_equal(got, knn.pairwise_distances(X, X, metric=metric))
    assert np.array_equal(got, knn.pairwise_distances(X, X.copy(), metric=metric))
    if metric != "kl_divergence":
        assert np.array_equal(got, got.T)
