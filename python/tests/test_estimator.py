"""NearestNeighbors, the graphs and KNeighborsTransformer against scikit-learn, on raw counts.

Distances are compared within the SPEC's tolerance; indices wherever the reference's distances
are distinct (ties go to the earlier fitted row here, to no fixed row in scikit-learn's brute
force, which the tie test below pins down on its own).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import sklearn.neighbors as skn
from sklearn.base import clone

import datafusion_sparse_knn as knn
from conftest import KOS, KOS_DIM
from reference import EXPANDED

SPARSE_METRICS = ["cosine", "euclidean", "manhattan"]
# scikit-learn's brute force runs these through scipy on dense input.
DENSE_METRICS = ["chebyshev", "braycurtis", "canberra", "jaccard", "correlation", "sqeuclidean"]


def tolerance(metric, ref_d, ref_i, X_rows, Y):
    """The SPEC's tolerance for each reference distance: `ref_d[r, j]` is between row r of
    `X_rows` and row `ref_i[r, j]` of `Y`."""
    tol = 1e-4 * np.maximum(1.0, np.abs(ref_d))
    if metric in EXPANDED:
        sq_x = np.asarray(X_rows.multiply(X_rows).sum(axis=1)).reshape(-1, 1)
        sq_y = np.asarray(Y.multiply(Y).sum(axis=1)).ravel()
        tol = np.maximum(tol, 1e-3 * np.sqrt(sq_x + sq_y[ref_i]))
    return tol


def assert_same_neighbors(metric, got_d, got_i, ref_d, ref_i, tol, distinct_share=0.3):
    """`ref_*` has one column more than `got_*` (k + 1), to tell whether the k-th is tied.
    At least `distinct_share` of the positions must have been compared by index."""
    k = got_d.shape[1]
    assert got_d.shape == got_i.shape == (ref_d.shape[0], k)
    assert got_d.dtype == np.float64 and got_i.dtype == np.int64
    np.testing.assert_array_less(np.abs(got_d - ref_d[:, :k]), tol[:, :k] + 1e-12, err_msg=metric)
    compared = 0
    for r in range(ref_d.shape[0]):
        d = ref_d[r]
        for j in range(k):
            before = j > 0 and abs(d[j] - d[j - 1]) <= 2 * tol[r, j]
            after = j + 1 < len(d) and abs(d[j + 1] - d[j]) <= 2 * tol[r, j]
            if not (before or after):
                assert got_i[r, j] == ref_i[r, j], f"{metric}, row {r}, position {j}"
                compared += 1
    # The comparison must have compared something (counts tie often under some metrics).
    assert compared > distinct_share * got_i.size, f"{metric}: only {compared} distinct positions"
    # Equal distances are in fitted-row order (the SPEC's tie rule).
    tied = got_d[:, 1:] == got_d[:, :-1]
    assert (got_i[:, 1:][tied] > got_i[:, :-1][tied]).all(), f"{metric}: ties not in row order"


def reference(metric, X, Y, k, dense=False, p=None):
    """scikit-learn's brute force: k + 1 neighbours (X=None: each fitted row's own pair out)."""
    params = {"p": p} if p is not None else {}
    def rows(M):
        M = M.toarray() if dense else M
        # The set metrics on the boolean "nonzero" view, as the SPEC defines them.
        return M != 0 if metric == "jaccard" else M

    nn = skn.NearestNeighbors(n_neighbors=k + 1, algorithm="brute", metric=metric, **params).fit(rows(Y))
    if X is None:
        return nn.kneighbors(None)
    return nn.kneighbors(rows(X))


def ref_tolerance(metric, X, Y, ref_d, ref_i):
    return tolerance(metric, ref_d, ref_i, Y if X is None else X, Y)


@pytest.mark.parametrize("metric", SPARSE_METRICS)
def test_kneighbors_against_sklearn_on_counts(kos, metric):
    X, Y = kos[:60], kos[60:]
    nn = knn.NearestNeighbors(n_neighbors=7, metric=metric).fit(Y)
    assert nn.n_samples_fit_ == Y.shape[0] and nn.n_features_in_ == KOS_DIM
    ref_d, ref_i = reference(metric, X, Y, 7)
    d, i = nn.kneighbors(X)
    assert_same_neighbors(metric, d, i, ref_d, ref_i, ref_tolerance(metric, X, Y, ref_d, ref_i))
    # The fitted index answers again, with another k, and the indices alone.
    i3 = nn.kneighbors(X[:5], n_neighbors=3, return_distance=False)
    assert np.array_equal(i3, i[:5, :3])


@pytest.mark.parametrize("metric", SPARSE_METRICS + DENSE_METRICS)
def test_kneighbors_of_the_fitted_rows(kos, metric):
    Y = kos[:150]
    dense = metric in DENSE_METRICS
    ref_d, ref_i = reference(metric, None, Y, 5, dense=dense)
    nn = knn.NearestNeighbors(n_neighbors=5, metric=metric).fit(Y)
    d, i = nn.kneighbors()
    # scikit-learn leaves each row's own pair out; so do we, by position.
    assert not (i == np.arange(Y.shape[0])[:, None]).any()
    share = 0.05 if dense else 0.3  # counts tie often under chebyshev, jaccard, ...
    assert_same_neighbors(metric, d, i, ref_d, ref_i, ref_tolerance(metric, None, Y, ref_d, ref_i), share)


def test_minkowski_p3_with_the_option(kos):
    X, Y = kos[:30], kos[30:200]
    ref_d, ref_i = reference("minkowski", X, Y, 4, dense=True, p=3)
    d, i = knn.NearestNeighbors(n_neighbors=4, metric="minkowski", p=3).fit(Y).kneighbors(X)
    assert_same_neighbors("minkowski", d, i, ref_d, ref_i, ref_tolerance("minkowski", X, Y, ref_d, ref_i))


def test_ties_go_to_the_earlier_fitted_row():
    Y = sp.csr_matrix(np.array([[1.0, 0, 2], [0, 5, 0], [1.0, 0, 2], [2.0, 0, 4], [1.0, 0, 2]]))
    nn = knn.NearestNeighbors(n_neighbors=4, metric="cosine").fit(Y)
    d, i = nn.kneighbors(Y[:1])
    # Rows 0, 2, 3 and 4 are all at cosine distance 0 from row 0: in row order.
    assert i.tolist() == [[0, 2, 3, 4]]
    np.testing.assert_allclose(d, 0, atol=1e-6)
    # X=None: row 2's own pair is left out, its twins 0 and 3, 4 follow in row order.
    i = nn.kneighbors(n_neighbors=3, return_distance=False)
    assert i[2].tolist() == [0, 3, 4] and i[0].tolist() == [2, 3, 4]


@pytest.mark.parametrize("metric", ["cosine", "manhattan"])
def test_radius_neighbors_against_sklearn(kos, metric):
    X, Y = kos[:40], kos[40:300]
    radius = 0.55 if metric == "cosine" else 150.0
    nn = knn.NearestNeighbors(radius=radius, metric=metric).fit(Y)
    sk = skn.NearestNeighbors(radius=radius, algorithm="brute", metric=metric).fit(Y)
    for query in (X, None):
        d, i = nn.radius_neighbors(query)
        ref_d, ref_i = sk.radius_neighbors(query, sort_results=True)
        assert d.dtype == object and len(d) == len(ref_d)
        found = 0
        for r in range(len(ref_d)):
            # The same pairs (none sits on the boundary here), nearest first.
            assert sorted(i[r].tolist()) == sorted(ref_i[r].tolist()), (metric, query is None, r)
            order = np.argsort(ref_i[r])
            np.testing.assert_allclose(d[r][np.argsort(i[r])], ref_d[r][order], rtol=1e-4, atol=1e-6)
            assert (np.diff(d[r]) >= 0).all()
            found += len(i[r])
        assert found > len(ref_d), "the radius finds more than a pair a row"
    # The graph: the same pairs as scikit-learn's, each row in ascending distance.
    g = nn.radius_neighbors_graph(X, mode="distance")
    ref = sk.radius_neighbors_graph(X, mode="distance", sort_results=True)
    assert isinstance(g, sp.csr_matrix) and g.shape == ref.shape == (40, Y.shape[0])
    assert g.nnz == ref.nnz
    for r in range(g.shape[0]):
        row = g.data[g.indptr[r]:g.indptr[r + 1]]
        assert (np.diff(row) >= 0).all()
    c = nn.radius_neighbors_graph(X, mode="connectivity")
    assert (c.data == 1).all() and (c.indices == g.indices).all()
    # (toarray sorts a row's entries by column, in place: last.)
    np.testing.assert_allclose(g.toarray(), ref.toarray(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["connectivity", "distance"])
def test_kneighbors_graph_against_sklearn(kos, mode):
    X, Y = kos[:50], kos[50:]
    nn = knn.NearestNeighbors(n_neighbors=6, metric="cosine").fit(Y)
    sk = skn.NearestNeighbors(n_neighbors=6, algorithm="brute", metric="cosine").fit(Y)
    for query in (X, None):
        g = nn.kneighbors_graph(query, mode=mode)
        ref = sk.kneighbors_graph(query, mode=mode)
        assert isinstance(g, sp.csr_matrix) and g.shape == ref.shape
        assert np.array_equal(g.indptr, ref.indptr)
        # Same layout as scikit-learn's: each row's neighbours in ascending distance.
        ref_d, ref_i = sk.kneighbors(query, n_neighbors=7)
        n = g.shape[0]
        got_i = g.indices.reshape(n, 6).astype(np.int64)  # scipy stores int32
        got_d = nn.kneighbors(query)[0]
        assert_same_neighbors("cosine", got_d, got_i, ref_d, ref_i, np.full(ref_d.shape, 1e-4))
        if mode == "connectivity":
            assert (g.data == 1).all()
        else:
            np.testing.assert_allclose(g.data.reshape(n, 6), got_d)
            assert (np.diff(g.data.reshape(n, 6), axis=1) >= 0).all()


def test_transformer_against_sklearn(kos):
    X = kos[:200]
    ours = knn.KNeighborsTransformer(n_neighbors=8, metric="cosine")
    sk = skn.KNeighborsTransformer(n_neighbors=8, metric="cosine", algorithm="brute")
    g = ours.fit_transform(X)
    ref = sk.fit_transform(X)
    n = X.shape[0]
    assert isinstance(g, sp.csr_matrix) and g.shape == ref.shape == (n, n)
    assert np.array_equal(g.indptr, ref.indptr)  # n_neighbors + 1 entries a row
    # Each sample itself first, at a stored 0.
    starts = g.indptr[:-1]
    assert np.array_equal(g.indices[starts], np.arange(n))
    assert (g.data[starts] == 0).all() and g.nnz == n * 9
    data = g.data.reshape(n, 9)
    assert (np.diff(data, axis=1) >= 0).all()
    ref_data = ref.data.reshape(n, 9)
    np.testing.assert_allclose(data, ref_data, atol=1e-5)
    # New rows: n_neighbors + 1 nearest fitted rows, as scikit-learn's transform.
    Z = kos[200:230]
    np.testing.assert_allclose(ours.transform(Z).toarray(), sk.transform(Z).toarray(), atol=1e-5)
    # connectivity: n_neighbors entries, self first.
    c = knn.KNeighborsTransformer(n_neighbors=4, mode="connectivity").fit_transform(X)
    assert c.nnz == n * 4 and (c.data == 1).all()
    assert np.array_equal(c.indices[c.indptr[:-1]], np.arange(n))


def test_params_and_clone():
    nn = knn.NearestNeighbors(n_neighbors=3, metric="minkowski", p=3, device="cpu")
    params = nn.get_params()
    assert params["n_neighbors"] == 3 and params["p"] == 3 and params["device"] == "cpu"
    assert nn.set_params(n_neighbors=9, radius=2.0) is nn and nn.n_neighbors == 9
    with pytest.raises(ValueError, match="Invalid parameter"):
        nn.set_params(algorithm="brute")
    twin = clone(nn)
    assert twin.get_params() == nn.get_params() and twin is not nn
    t = knn.KNeighborsTransformer(n_neighbors=4, metric="euclidean", mode="connectivity")
    assert clone(t).get_params() == t.get_params()
    assert t.get_params()["mode"] == "connectivity"


def test_without_sklearn():
    # scikit-learn is optional: the estimators bring their own get_params / set_params.
    code = """
import sys
sys.modules["sklearn"] = None
import numpy as np, scipy.sparse as sp
import datafusion_sparse_knn as knn
nn = knn.NearestNeighbors(n_neighbors=2, metric="manhattan", p=None)
assert nn.get_params()["n_neighbors"] == 2
nn.set_params(n_neighbors=1)
try:
    nn.set_params(bogus=1)
except ValueError as e:
    assert "Invalid parameter" in str(e)
else:
    raise AssertionError("set_params took an unknown parameter")
try:
    nn.kneighbors(np.eye(3))
except ValueError as e:
    assert "not fitted" in str(e)
else:
    raise AssertionError("kneighbors before fit")
Y = sp.csr_matrix(np.array([[1.0, 0], [0, 3.0], [2.0, 2.0]]))
print(nn.fit(Y).kneighbors(Y, return_distance=False).ravel().tolist(), repr(nn))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(" ", 3)[:3] == ["[0,", "1,", "2]"], out.stdout
    assert "NearestNeighbors(" in out.stdout


def test_input_kinds_for_fit_and_queries(kos, kos_table, tmp_path):
    nn = knn.NearestNeighbors(n_neighbors=4, metric="cosine").fit(kos)
    want_d, want_i = nn.kneighbors(kos[:12])
    pq.write_table(kos_table.slice(0, 12), tmp_path / "q.parquet")
    for name, X in {
        "dense": kos[:12].toarray(),
        "float32": kos[:12].astype(np.float32),
        "csc": kos[:12].tocsc(),
        "arrow": kos_table.slice(0, 12),
        "parquet": tmp_path / "q.parquet",
    }.items():
        d, i = nn.kneighbors(X)
        assert np.array_equal(i, want_i), name
        np.testing.assert_allclose(d, want_d, rtol=1e-6, err_msg=name)
    for name, Y in {"arrow": kos_table, "parquet": KOS, "dense": kos.toarray()}.items():
        d, i = knn.NearestNeighbors(n_neighbors=4, dim=KOS_DIM).fit(Y).kneighbors(kos[:12])
        assert np.array_equal(i, want_i), name


def test_errors(kos):
    nn = knn.NearestNeighbors(n_neighbors=3)
    with pytest.raises(ValueError, match="not fitted"):
        nn.kneighbors(kos[:2])
    nn.fit(kos[:10])
    with pytest.raises(ValueError, match="n_neighbors <= n_samples_fit"):
        nn.kneighbors(kos[:2], n_neighbors=11)
    # X=None leaves each row's own pair out: 9 others at most.
    assert nn.kneighbors(n_neighbors=9)[1].shape == (10, 9)
    with pytest.raises(ValueError, match="n_neighbors <= n_samples_fit"):
        nn.kneighbors(n_neighbors=10)
    with pytest.raises(ValueError, match="expecting 6906 features"):
        nn.kneighbors(np.ones((2, 5)))
    with pytest.raises(ValueError, match="Unsupported mode"):
        nn.kneighbors_graph(mode="distances")
    with pytest.raises(ValueError, match="n_neighbors must be an integer"):
        nn.kneighbors(kos[:2], n_neighbors=0)
    with pytest.raises(ValueError, match="unknown metric|metric"):
        knn.NearestNeighbors(metric="nope").fit(kos[:10])
    with pytest.raises(ValueError, match="negative|>= 0"):
        knn.NearestNeighbors(metric="hellinger").fit(sp.csr_matrix(np.array([[1.0, -2.0]])))
    with pytest.raises(ValueError, match="radius"):
        nn.radius_neighbors(kos[:2], radius=-1.0)


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "sqeuclidean", "manhattan"])
def test_graph_of_the_fitted_rows_is_the_probe_bit_for_bit(pbmc, metric):
    """X=None on raw counts takes the symmetric dense block (each pair once); the probe of the
    same rows as queries, each row's own pair dropped from its k + 1, is the reference, bit for
    bit. Halved counts (fractions: the block would sum in another order) take the probe."""
    k = 15
    for X in (pbmc, pbmc * 0.5):
        nn = knn.NearestNeighbors(n_neighbors=k, metric=metric, device="cpu").fit(X)
        d, i = nn.kneighbors()
        ref_d, ref_i = nn.kneighbors(X, n_neighbors=k + 1)
        own = ref_i == np.arange(X.shape[0])[:, None]
        assert (own.sum(axis=1) == 1).all(), metric  # each row finds itself among its k + 1
        ref_d = ref_d[~own].reshape(-1, k)
        ref_i = ref_i[~own].reshape(-1, k)
        assert np.array_equal(i, ref_i), metric
        assert np.array_equal(d.view(np.int64), ref_d.view(np.int64)), metric
        g = nn.kneighbors_graph(mode="distance")
        assert np.array_equal(g.indices, i.ravel()) and np.array_equal(g.data, d.ravel())


def test_umap_takes_our_precomputed_knn(pbmc):
    umap = pytest.importorskip("umap")
    X = pbmc[:400]
    knn_graph = knn.precomputed_knn(X, n_neighbors=10, metric="cosine")
    reducer = umap.UMAP(n_neighbors=10, metric="cosine", precomputed_knn=knn_graph, n_epochs=20, random_state=0)
    emb = reducer.fit_transform(X)
    assert emb.shape == (400, 2) and np.isfinite(emb).all()
    # UMAP kept our lists rather than searching again.
    assert np.array_equal(reducer._knn_indices, knn_graph[0])


def test_self_first_graph_for_umap(pbmc):
    X = pbmc[:300]
    idx, dist = knn.precomputed_knn(X, n_neighbors=10, metric="cosine")
    assert idx.shape == dist.shape == (300, 10)
    assert (idx[:, 0] == np.arange(300)).all() and (dist[:, 0] == 0).all()
    sk = skn.NearestNeighbors(n_neighbors=9, algorithm="brute", metric="cosine").fit(X)
    ref_d, _ = sk.kneighbors()
    np.testing.assert_allclose(dist[:, 1:], ref_d, atol=1e-5)


class SklearnSelfAtZero(skn.KNeighborsTransformer):
    """scikit-learn's transformer with each sample's own distance set to the exact 0 it is.

    On float32 data its expanded euclidean form leaves some at ~1e-6 (321 of the 1,258 PBMC
    cells), and UMAP's connectivities take the first nonzero distance as a cell's rho: those
    cells would get other weights for that float noise alone."""

    def fit_transform(self, X, y=None):
        graph = super().fit_transform(X)
        rows = np.repeat(np.arange(graph.shape[0]), np.diff(graph.indptr))
        graph.data[graph.indices == rows] = 0.0
        return graph


def test_scanpy_neighbors_with_our_transformer(pbmc):
    import anndata
    import scanpy as sc

    def neighbors(transformer):
        adata = anndata.AnnData(pbmc.astype(np.float32))
        sc.pp.normalize_total(adata, target_sum=1e4)
        sc.pp.log1p(adata)
        sc.pp.pca(adata, n_comps=30, random_state=0)
        sc.pp.neighbors(adata, transformer=transformer)
        return adata

    ours = neighbors(knn.KNeighborsTransformer(n_neighbors=15, metric="euclidean"))
    ref = neighbors(SklearnSelfAtZero(n_neighbors=15, metric="euclidean", algorithm="brute"))
    assert np.array_equal(ours.obsm["X_pca"], ref.obsm["X_pca"])
    for key in ("distances", "connectivities"):
        a, b = ours.obsp[key], ref.obsp[key]
        assert a.shape == b.shape == (pbmc.shape[0],) * 2
        # The same edges (scanpy drops the self entries from distances) ...
        assert (a != 0).nnz == (b != 0).nnz > 10 * pbmc.shape[0], key
        assert np.array_equal((a != 0).toarray(), (b != 0).toarray()), key
        # ... with the same weights.
        np.testing.assert_allclose(a.toarray(), b.toarray(), rtol=1e-4, atol=1e-5, err_msg=key)


def test_save_and_load_an_index_file(kos, tmp_path):
    nn = knn.NearestNeighbors(n_neighbors=5, metric="minkowski", p=3).fit(kos)
    path = tmp_path / "kos.skidx"
    assert nn.save(path) == path.stat().st_size > 0
    loaded = knn.NearestNeighbors.load(path, n_neighbors=5)
    assert loaded.metric == "minkowski" and loaded.p == 3 and loaded.n_samples_fit_ == kos.shape[0]
    for query in (kos[:20], None):
        d, i = loaded.kneighbors(query)
        want_d, want_i = nn.kneighbors(query)
        assert np.array_equal(i, want_i) and np.array_equal(d, want_d)
    g = loaded.radius_neighbors_graph(kos[:10], radius=40.0, mode="distance")
    assert (g != nn.radius_neighbors_graph(kos[:10], radius=40.0, mode="distance")).nnz == 0
    # A damaged file is an error naming it, never a wrong answer.
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad.skidx").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="bad.skidx"):
        knn.NearestNeighbors.load(tmp_path / "bad.skidx").kneighbors(kos[:2])
    # The file is a right input of the one-shot knn_join too (its stored index is probed).
    table = knn.knn_join(kos[:3], str(path), "minkowski", 5, p=3).sort_by([("query_row", "ascending"), ("rank", "ascending")])
    assert table.column("neighbor_row").to_pylist() == nn.kneighbors(kos[:3])[1].ravel().tolist()


def test_load_an_index_folder_of_segments(kos, tmp_path):
    # An index folder as `sparse-knn index` writes one over a folder of files: segments (each an
    # index file of a run of the rows) named in manifest.json. Loaded, it answers as one index
    # over the rows end to end: as a fit on them all.
    folder = tmp_path / "kos.skidx"
    folder.mkdir()
    cut = kos.shape[0] // 3
    segments = []
    for n, part in enumerate((kos[:cut], kos[cut:])):
        name = f"segment-000001-{n:03d}.skidx"
        knn.NearestNeighbors(metric="cosine").fit(part).save(folder / name)
        segments.append({"file": name, "rows": part.shape[0], "sources": []})
    manifest = {
        "sparse_knn_index_folder": 1,
        "generation": 1,
        "input": "kos/",
        "metrics": ["cosine"],
        "options": "",
        "segments": segments,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    loaded = knn.NearestNeighbors.load(folder, n_neighbors=6)
    assert loaded.n_samples_fit_ == kos.shape[0]
    whole = knn.NearestNeighbors(n_neighbors=6, metric="cosine").fit(kos)
    d, i = loaded.kneighbors(kos[cut - 5 : cut + 5])
    want_d, want_i = whole.kneighbors(kos[cut - 5 : cut + 5])
    assert np.array_equal(i, want_i)
    np.testing.assert_allclose(d, want_d, rtol=1e-12, atol=1e-15)
    # A segment the manifest names that is not there: an error naming it.
    (folder / segments[1]["file"]).unlink()
    with pytest.raises(ValueError, match="segment-000001-001"):
        knn.NearestNeighbors.load(folder).kneighbors(kos[:2])
