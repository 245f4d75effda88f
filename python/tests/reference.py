"""Float64 references (scikit-learn and scipy) and the SPEC's tolerance."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist
from scipy.special import rel_entr

# Where an expanded form (norms + dot product) cancels, the SPEC allows an absolute error of
# 1e-3 * sqrt(|x|^2 + |y|^2); everywhere else 1e-4 * max(1, |reference|).
EXPANDED = {"euclidean", "sqeuclidean", "correlation"}
BOOLEAN = {"jaccard", "dice", "russellrao"}


def reference_matrix(metric: str, X: np.ndarray, Y: np.ndarray, p: float = 2) -> np.ndarray:
    """The full float64 distance matrix by scipy (numpy for what scipy has no cdist metric of)."""
    if metric in BOOLEAN:
        # The SPEC's set metrics are scipy's on the boolean "nonzero" view.
        return cdist(X != 0, Y != 0, metric)
    if metric == "minkowski":
        return cdist(X, Y, "minkowski", p=p)
    if metric == "hellinger":
        return cdist(np.sqrt(X), np.sqrt(Y), "euclidean") / np.sqrt(2)
    if metric == "kl_divergence":
        return rel_entr(X[:, None, :], Y[None, :, :]).sum(axis=2)
    if metric == "dot":
        return X @ Y.T
    # scipy knows the L1 distance as cityblock only.
    return cdist(X, Y, "cityblock" if metric == "manhattan" else metric)


def tolerance(metric: str, ref: np.ndarray, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    tol = 1e-4 * np.maximum(1.0, np.abs(np.nan_to_num(ref, posinf=0.0)))
    if metric in EXPANDED:
        sq_x = (X * X).sum(axis=1)[:, None]
        sq_y = (Y * Y).sum(axis=1)[None, :]
        tol = np.maximum(tol, 1e-3 * np.sqrt(sq_x + sq_y))
    return tol


def close(got, want, tol) -> np.ndarray:
    both_inf = np.isinf(got) & np.isinf(want) & (np.sign(got) == np.sign(want))
    return both_inf | (np.abs(got - want) <= tol)


def assert_knn(metric, distances, indices, X, Y, k, p=2):
    """Distances equal the reference's k smallest (largest for dot) per row within tolerance, and
    each returned index really has the returned distance: the indices are right up to ties."""
    ref = reference_matrix(metric, X, Y, p)
    tol = tolerance(metric, ref, X, Y)
    n = X.shape[0]
    assert distances.shape == (n, k) and indices.shape == (n, k)
    assert distances.dtype == np.float64 and indices.dtype == np.int64
    for i in range(n):
        row = ref[i]
        order = np.argsort(-row if metric == "dot" else row, kind="stable")[:k]
        want = row[order]
        got = distances[i]
        ok = close(got, want, tol[i, order])
        assert ok.all(), (
            f"{metric}, row {i}: distances {got[~ok]} != reference {want[~ok]}"
        )
        assert len(set(indices[i].tolist())) == k, f"{metric}, row {i}: repeated index"
        assert ((indices[i] >= 0) & (indices[i] < Y.shape[0])).all()
        at = row[indices[i]]
        ok = close(got, at, tol[i, indices[i]])
        assert ok.all(), (
            f"{metric}, row {i}: the returned neighbours {indices[i][~ok]} are at {at[~ok]}, "
            f"not at the returned distances {got[~ok]}"
        )
    # Nearest first (for dot, a similarity: largest first).
    d = -distances if metric == "dot" else distances
    a, b = d[:, :-1], d[:, 1:]
    slack = 1e-9 * np.maximum(1.0, np.abs(np.nan_to_num(a, posinf=0.0, neginf=0.0)))
    assert ((b >= a - slack) | (np.isinf(a) & np.isinf(b))).all(), f"{metric}: not nearest first"
