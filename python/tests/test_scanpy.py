"""scanpy's ``pp.neighbors`` with our ``KNeighborsTransformer`` against scikit-learn's, and the
dtype and row order of every graph and distance array (issue #47).

scanpy (1.11) takes a transformer's graph as it is: each row's stored entries are its neighbours
by rank (UMAP's rho is the first nonzero distance), and the graph itself becomes
``obsp["distances"]``. scikit-learn's graphs come in its distances' dtype (float32 for float32
counts under cosine and euclidean), rows nearest first. A row stored nearest first is not in
scipy's canonical format, and scipy's ``astype`` to another dtype sorts such rows by column: the
graphs must come in the dtype a consumer works in, nearest first, with flags that say so.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn.neighbors as skn
from sklearn.metrics import pairwise_distances as sk_pairwise_distances

import datafusion_sparse_knn as knn

METRICS = ["cosine", "euclidean", "manhattan"]
DTYPES = [np.float32, np.float64]
dtype_id = lambda d: np.dtype(d).name  # noqa: E731


def neighbors(counts, transformer):
    pytest.importorskip("umap")
    anndata = pytest.importorskip("anndata")
    sc = pytest.importorskip("scanpy")
    adata = anndata.AnnData(counts)
    with warnings.catch_warnings():
        # anndata's and scanpy's own deprecation notices, nothing of ours.
        warnings.simplefilter("ignore", FutureWarning)
        sc.pp.neighbors(adata, n_neighbors=10, use_rep="X", transformer=transformer)
    return adata


class ScikitLearnExact(skn.KNeighborsTransformer):
    """scikit-learn's brute-force transformer with its float noise and its arbitrary ties taken
    out, in the dtype of scikit-learn's own graph.

    Its own graph differs from the exact one in three ways, each of which changes UMAP's
    connectivities on the PBMC counts by 0.1 to 0.6 (whatever the dtype of ours):
    * a cell's distance to itself is not always 0 (cosine: 1e-16 to 3e-14 in float64, up to
      2e-5 in float32, in half the cells), and UMAP takes the first nonzero distance as rho;
    * float32 cosine distances are computed in float32, off by up to 8e-6;
    * integer counts tie often under euclidean and manhattan, and its order among tied rows
      is arbitrary (ours: by row).
    So: scikit-learn's distances in float64, each row by (distance, row), the cell itself first
    at 0, rounded to the dtype its transformer gives."""

    def fit_transform(self, X, y=None):
        # The dtype of its graph of these rows (a few of them are as good as all).
        dtype = skn.KNeighborsTransformer(**self.get_params()).fit(X[:20]).transform(X[:3]).dtype
        D = sk_pairwise_distances(X.astype(np.float64), metric=self.metric)
        n, k = D.shape[0], self.n_neighbors + 1
        np.fill_diagonal(D, -1.0)  # the cell itself first, ahead of any duplicate of it
        order = np.argsort(D, axis=1, kind="stable")[:, :k]
        d = np.take_along_axis(D, order, axis=1)
        d[:, 0] = 0.0
        indptr = np.arange(0, n * k + 1, k)
        return sp.csr_matrix((d.ravel().astype(dtype), order.ravel(), indptr), shape=(n, n))


@pytest.fixture(scope="module")
def cells(pbmc):
    """600 of the PBMC cells (scikit-learn's sparse manhattan takes 15 s for all 1,258)."""
    return pbmc[:600]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("metric", METRICS)
def test_scanpy_neighbors_equal_scikit_learns(cells, metric, dtype):
    """PBMC counts, ``use_rep="X"`` (the issue's call): the distances and connectivities of
    scikit-learn's brute force, in its dtype, to 1e-6 (they come out equal)."""
    counts = cells.astype(dtype)
    ours = neighbors(counts, knn.KNeighborsTransformer(n_neighbors=10, metric=metric))
    ref = neighbors(counts, ScikitLearnExact(n_neighbors=10, metric=metric, algorithm="brute"))
    for key in ("distances", "connectivities"):
        a, b = ours.obsp[key], ref.obsp[key]
        assert a.dtype == b.dtype, (key, a.dtype, b.dtype)
        assert a.shape == b.shape == (cells.shape[0],) * 2
        # The same edges ...
        assert ((a != 0) != (b != 0)).nnz == 0, key
        # ... with the same values (relative for the distances: float32 euclidean distances of
        # counts are in the hundreds, where 1e-6 is a few float32 steps).
        np.testing.assert_allclose(a.toarray(), b.toarray(), rtol=1e-6, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("metric", METRICS)
def test_same_neighbours_as_scikit_learns_own_graph(cells, metric, dtype):
    """Against scikit-learn's graph as it is: the same dtype, the same neighbours of every cell
    but where its k-th and (k+1)-th are tied (to its float32 error), and the same distances to
    that error (ours are the float64 ones rounded)."""
    counts = cells.astype(dtype)
    ours = knn.KNeighborsTransformer(n_neighbors=10, metric=metric).fit_transform(counts)
    ref = skn.KNeighborsTransformer(n_neighbors=10, metric=metric, algorithm="brute").fit_transform(counts)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape and ours.nnz == ref.nnz
    n = counts.shape[0]
    D = sk_pairwise_distances(cells, metric=metric)
    near = np.sort(D, axis=1)[:, 10:12]  # each cell's 10th and 11th other than itself
    tied = np.isclose(near[:, 0], near[:, 1], rtol=1e-5, atol=1e-5)
    a, b = ours.indices.reshape(n, 11), ref.indices.reshape(n, 11)
    differ = np.array([set(a[i]) != set(b[i]) for i in range(n)])
    assert not (differ & ~tied).any(), np.flatnonzero(differ & ~tied)[:10]
    same = ~differ
    np.testing.assert_allclose(
        np.sort(ours.data.reshape(n, 11)[same], axis=1),
        np.sort(ref.data.reshape(n, 11)[same], axis=1),
        rtol=1e-5, atol=3e-5 if dtype == np.float32 else 1e-12)


# -- every graph: dtype, order, flags, conversions -------------------------------------------


def _radius(metric):
    # Some dozens of neighbours a cell on the PBMC counts.
    return {"cosine": 0.5, "euclidean": 60.0, "manhattan": 800.0}[metric]


def _graphs(X, metric):
    """Every graph the package makes, by name ("<call> <mode>")."""
    nn = knn.NearestNeighbors(n_neighbors=6, radius=_radius(metric), metric=metric).fit(X)
    queries = X[:40]
    makers = {
        "kneighbors_graph(X)": lambda mode: nn.kneighbors_graph(queries, mode=mode),
        "kneighbors_graph()": lambda mode: nn.kneighbors_graph(mode=mode),
        "radius_neighbors_graph(X)": lambda mode: nn.radius_neighbors_graph(queries, mode=mode),
        "radius_neighbors_graph()": lambda mode: nn.radius_neighbors_graph(mode=mode),
        "KNeighborsTransformer.fit_transform": lambda mode: knn.KNeighborsTransformer(
            n_neighbors=6, metric=metric, mode=mode).fit_transform(X),
        "KNeighborsTransformer.transform": lambda mode: knn.KNeighborsTransformer(
            n_neighbors=6, metric=metric, mode=mode).fit(X).transform(queries),
    }
    return {f"{call} {mode}": make(mode) for call, make in makers.items()
            for mode in ("distance", "connectivity")}


def _rows(g):
    return [slice(g.indptr[i], g.indptr[i + 1]) for i in range(g.shape[0])]


def _entry_distances(X, g, metric):
    """The float64 distance of each stored entry of ``g`` (queries: the first rows of ``X``),
    in storage order, by scikit-learn."""
    rows = np.repeat(np.arange(g.shape[0]), np.diff(g.indptr))
    D = sk_pairwise_distances(X[: g.shape[0]].astype(np.float64), X.astype(np.float64), metric=metric)
    return D[rows, g.indices]


def _assert_nearest_first(d, g, what):
    for i, r in enumerate(_rows(g)):
        # Ascending, to the float32 rounding of scikit-learn's own reference.
        assert np.all(np.diff(d[r]) >= -1e-6 * np.maximum(1.0, d[r][1:])), f"{what}: row {i}: {d[r]}"


def _assert_flags_say_the_order(g, what):
    """scipy's flags say what the arrays are: nothing cached contrary to them."""
    sorted_ = all(np.all(np.diff(g.indices[r]) > 0) for r in _rows(g))
    assert g.has_sorted_indices == sorted_, what
    assert g.has_canonical_format == sorted_, what  # no duplicates: canonical when sorted


@pytest.fixture(scope="module")
def pbmc_cut(pbmc):
    return pbmc[:300]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("metric", METRICS)
def test_graphs_in_scikit_learns_dtype_nearest_first(pbmc_cut, metric, dtype):
    X = pbmc_cut.astype(dtype)
    ref = skn.NearestNeighbors(n_neighbors=6, radius=_radius(metric), metric=metric, algorithm="brute").fit(X)
    sk = {mode: ref.kneighbors_graph(X[:40], mode=mode) for mode in ("distance", "connectivity")}
    want = {mode: g.dtype for mode, g in sk.items()}
    # What scikit-learn 1.9 gives: float32 distances for float32 counts under cosine and
    # euclidean (manhattan: float64, its ArgKmin's), ones in float64.
    assert want["distance"] == (np.float64 if metric == "manhattan" else dtype)
    assert want["connectivity"] == np.float64
    for name, g in _graphs(X, metric).items():
        mode = name.rsplit(" ", 1)[1]
        assert type(g) is type(sk[mode]) is sp.csr_matrix, name
        assert g.dtype == want[mode], (name, g.dtype, want[mode])
        assert g.indices.dtype == sk[mode].indices.dtype and g.indptr.dtype == sk[mode].indptr.dtype, name
        d = _entry_distances(X, g, metric)
        _assert_nearest_first(d, g, name)
        if mode == "distance":
            np.testing.assert_allclose(g.data, d, rtol=1e-6, atol=1e-6, err_msg=name)
        _assert_flags_say_the_order(g, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("metric", METRICS)
def test_conversions_of_a_graph_keep_its_order(pbmc_cut, metric, dtype):
    """``copy()``, ``tocsr()``, ``astype`` to the graph's dtype and the CSR constructors keep
    every row as it is (nearest first). ``astype`` to the other float dtype is the same matrix,
    but scipy sorts each row by column on the way (any non-canonical CSR: scikit-learn's graph
    goes the same way), and its flags say so; that is why the graphs come in scikit-learn's
    dtype, which a consumer such as scanpy takes as it is."""
    X = pbmc_cut.astype(dtype)
    for name, g in _graphs(X, metric).items():
        for how, h in {
            "copy()": g.copy(),
            "tocsr()": g.tocsr(),
            "tocsr(copy=True)": g.tocsr(copy=True),
            "astype(own dtype)": g.astype(g.dtype),
            "astype(own dtype, copy=False)": g.astype(g.dtype, copy=False),
            "csr_matrix(g)": sp.csr_matrix(g),
            "csr_array(g)": sp.csr_array(g),
            "csr_matrix(g, dtype=own)": sp.csr_matrix(g, dtype=g.dtype),
        }.items():
            assert h.dtype == g.dtype, (name, how)
            for part in ("indptr", "indices", "data"):
                assert np.array_equal(getattr(h, part), getattr(g, part)), (name, how, part)
            _assert_flags_say_the_order(h, f"{name} {how}")
        other = np.float32 if g.dtype == np.float64 else np.float64
        there = g.astype(other)
        back = there.astype(g.dtype)
        for how, h in {"astype(other)": there, "astype(other).astype(own)": back}.items():
            _assert_flags_say_the_order(h, f"{name} {how}")
            assert h.has_sorted_indices, f"{name} {how}: scipy kept a non-canonical row order"
            diff = abs(h.astype(np.float64) - g.astype(np.float64))
            assert diff.nnz == 0 or diff.max() <= 1e-6 * max(1.0, abs(g).max()), (name, how)
    ref = skn.NearestNeighbors(n_neighbors=6, metric=metric, algorithm="brute").fit(X)
    sk = ref.kneighbors_graph(X[:40], mode="distance")
    assert not sk.has_sorted_indices
    assert sk.astype(np.float32 if sk.dtype == np.float64 else np.float64).has_sorted_indices


def test_graphs_follow_scikit_learns_sparse_interface(pbmc_cut):
    """scikit-learn 1.9 hands out csr_array graphs when set to; so do we."""
    import sklearn

    X = pbmc_cut[:50].astype(np.float32)
    with sklearn.config_context(sparse_interface="sparray"):
        ref = skn.KNeighborsTransformer(n_neighbors=4, algorithm="brute", metric="cosine").fit_transform(X)
        for name, g in _graphs(X, "cosine").items():
            assert type(g) is type(ref) is sp.csr_array, name
            assert g.dtype == (ref.dtype if "distance" in name else np.float64), name


# -- every distance array: dtype ---------------------------------------------------------------

# (metric, params, input): scikit-learn's brute force takes sparse input for its own metrics,
# dense for scipy's.
CASES = [
    ("cosine", {}, "sparse"), ("euclidean", {}, "sparse"), ("l2", {}, "sparse"),
    ("manhattan", {}, "sparse"), ("minkowski", {"p": 2}, "sparse"), ("minkowski", {"p": 1}, "sparse"),
    ("cosine", {}, "dense"), ("euclidean", {}, "dense"), ("minkowski", {"p": 3}, "dense"),
    ("chebyshev", {}, "dense"), ("braycurtis", {}, "dense"), ("canberra", {}, "dense"),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64], ids=dtype_id)
@pytest.mark.parametrize(("metric", "params", "form"), CASES, ids=lambda c: str(c))
def test_distance_arrays_in_scikit_learns_dtype(pbmc_cut, metric, params, form, dtype):
    """kneighbors and radius_neighbors (the estimator's and the functions') and
    pairwise_distances give the dtype scikit-learn 1.9 gives for the same input."""
    X = pbmc_cut[:60].astype(dtype)
    X = X if form == "sparse" else X.toarray()
    Q = X[:5]
    ref = skn.NearestNeighbors(n_neighbors=3, radius=1e9, metric=metric, algorithm="brute", **params).fit(X)
    want = ref.kneighbors(Q)[0].dtype
    assert ref.kneighbors()[0].dtype == ref.radius_neighbors(Q)[0][0].dtype == want
    nn = knn.NearestNeighbors(n_neighbors=3, radius=1e9, metric=metric, **params).fit(X)
    got = {
        "NearestNeighbors.kneighbors(X)": nn.kneighbors(Q)[0],
        "NearestNeighbors.kneighbors()": nn.kneighbors()[0],
        "NearestNeighbors.radius_neighbors(X)": nn.radius_neighbors(Q)[0][0],
        "NearestNeighbors.radius_neighbors()": nn.radius_neighbors()[0][0],
        "kneighbors": knn.kneighbors(Q, X, k=3, metric=metric, **params)[0],
        "radius_neighbors": knn.radius_neighbors(Q, X, radius=1e9, metric=metric, **params)[0][0],
    }
    for what, d in got.items():
        assert d.dtype == want, (what, d.dtype, want)
    try:
        pw_want = sk_pairwise_distances(Q, X, metric=metric, **params).dtype
    except TypeError:  # scipy's metrics take no sparse input: scikit-learn's answer is dense's
        pw_want = sk_pairwise_distances(Q.toarray(), X.toarray(), metric=metric, **params).dtype
    for what, d in {
        "pairwise_distances(X, Y)": knn.pairwise_distances(Q, X, metric=metric, **params),
        "pairwise_distances(X)": knn.pairwise_distances(X, metric=metric, **params),
    }.items():
        assert d.dtype == pw_want, (what, d.dtype, pw_want)
        assert d.flags.c_contiguous and d.flags.writeable, what


def test_mixed_float32_and_float64_give_float64(pbmc_cut):
    X32 = pbmc_cut[:60].astype(np.float32)
    X64 = pbmc_cut[:60]
    nn = knn.NearestNeighbors(n_neighbors=3, metric="cosine").fit(X32)
    assert nn.kneighbors(X32[:5])[0].dtype == np.float32
    assert nn.kneighbors(X64[:5])[0].dtype == np.float64
    nn64 = knn.NearestNeighbors(n_neighbors=3, metric="cosine").fit(X64)
    assert nn64.kneighbors(X32[:5])[0].dtype == np.float64
    assert knn.pairwise_distances(X32[:5], X64, metric="cosine").dtype == np.float64
    assert knn.kneighbors(X32[:5], X64, k=3, metric="cosine")[0].dtype == np.float64
    ref = skn.NearestNeighbors(n_neighbors=3, metric="cosine", algorithm="brute").fit(X32)
    assert ref.kneighbors(X64[:5])[0].dtype == np.float64


def test_float32_rows_are_ordered_by_the_float64_distance(pbmc_cut):
    """The float32 distances are the float64 ones rounded, in the float64 order."""
    X32 = pbmc_cut.astype(np.float32)
    d32, i32 = knn.NearestNeighbors(n_neighbors=8, metric="cosine").fit(X32).kneighbors(X32[:50])
    d64, i64 = knn.NearestNeighbors(n_neighbors=8, metric="cosine").fit(pbmc_cut).kneighbors(pbmc_cut[:50])
    assert d32.dtype == np.float32 and d64.dtype == np.float64
    assert np.array_equal(i32, i64)
    assert np.array_equal(d32, d64.astype(np.float32))
    assert (np.diff(d32, axis=1) >= 0).all()
