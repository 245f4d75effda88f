"""The Python API without DataFusion: input kinds, output shapes, knn_join tables, errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

import datafusion_sparse_knn as knn
from conftest import KOS, KOS_DIM


def test_version_is_the_crates():
    import re
    from pathlib import Path

    # The workspace version that both Cargo packages inherit (tomllib needs Python 3.11).
    cargo = (Path(__file__).parents[2] / "Cargo.toml").read_text()
    section = cargo.split("[workspace.package]", 1)[1].split("\n[", 1)[0]
    version = re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)
    assert knn.__version__ == version


def test_every_input_kind_gives_the_same_answer(kos, kos_table, tmp_path):
    want_d, want_i = knn.kneighbors(kos[:25], kos, k=6, metric="cosine")
    assert want_d.shape == (25, 6)
    inputs = {
        "csc": (kos[:25].tocsc(), kos.tocsc()),
        "dense": (kos[:25].toarray(), kos.toarray()),
        "float32": (kos[:25].astype(np.float32), kos.astype(np.float32)),
        "int64 indices": (sp.csr_matrix((kos[:25].data, kos[:25].indices.astype(np.int64),
                                         kos[:25].indptr.astype(np.int64)), shape=(25, KOS_DIM)),
                          kos),
        "coo": (kos[:25].tocoo(), kos.tocoo()),
        "pyarrow table": (kos_table.slice(0, 25), kos_table),
        "record batch": (kos_table.slice(0, 25).combine_chunks().to_batches()[0], kos_table),
        "reader": (kos_table.slice(0, 25).to_reader(), kos_table.to_reader(max_chunksize=64)),
        "parquet path": (str(tmp_path / "q.parquet"), KOS),
    }
    pq.write_table(kos_table.slice(0, 25), tmp_path / "q.parquet")
    for name, (X, Y) in inputs.items():
        d, i = knn.kneighbors(X, Y, k=6, metric="cosine")
        assert np.array_equal(i, want_i), name
        assert np.allclose(d, want_d, rtol=1e-6, atol=1e-7), name


def test_duplicates_summed_and_stored_zeros_dropped():
    # scipy's meaning: duplicate entries add up; a stored zero is a zero (jaccard must not count it).
    X = sp.csr_matrix((np.array([1.0, 2.0, 0.0]), np.array([0, 0, 2]), np.array([0, 3])),
                      shape=(1, 4))
    Y = sp.csr_matrix(np.array([[3.0, 0, 0, 0], [0, 0, 5.0, 0]]))
    d, i = knn.kneighbors(X, Y, k=2, metric="jaccard")
    assert i.tolist() == [[0, 1]] and d.tolist() == [[0.0, 1.0]]
    d, _ = knn.kneighbors(X, Y, k=1, metric="euclidean")
    assert d[0, 0] == 0.0


def test_return_distance_false(counts):
    X, Y = counts
    indices = knn.kneighbors(X, Y, k=3, return_distance=False)
    assert indices.shape == (X.shape[0], 3) and indices.dtype == np.int64
    ind = knn.radius_neighbors(X, Y, radius=0.5, return_distance=False)
    assert ind.dtype == object and len(ind) == X.shape[0]


def test_radius_neighbors_equal_lengths_stay_object_arrays():
    X = sp.csr_matrix(np.eye(3))
    d, i = knn.radius_neighbors(X, radius=0.5, metric="euclidean")
    assert d.shape == (3,) and i.shape == (3,)
    assert [list(r) for r in i] == [[0], [1], [2]]


def test_knn_join_table(kos_table, counts):
    table = knn.knn_join(kos_table.slice(0, 10), kos_table, "manhattan", 3)
    assert isinstance(table, pa.Table)
    assert table.column_names == ["query_doc_id", "neighbor_doc_id", "distance", "rank"]
    assert table.num_rows == 30
    assert table.schema.field("distance").type == pa.float64()
    assert table.schema.field("rank").type == pa.int32()
    # A matrix has one other column, its row position.
    X, Y = counts
    table = knn.knn_join(X, Y, metric="cosine", k=2)
    assert table.column_names == ["query_row", "neighbor_row", "distance", "rank"]
    d, i = knn.kneighbors(X, Y, k=2, metric="cosine")
    t = table.sort_by([("query_row", "ascending"), ("rank", "ascending")])
    assert np.array_equal(t.column("neighbor_row").to_numpy().reshape(-1, 2), i)
    # The same object twice is one input, so exclude_self applies.
    t = knn.knn_join(X, X, "cosine", 2, exclude_self=True)
    assert (t.column("query_row").to_numpy() != t.column("neighbor_row").to_numpy()).all()


def test_radius_join_table(counts):
    X, Y = counts
    table = knn.radius_join(X, Y, "cosine", 0.6)
    assert table.column_names == ["query_row", "neighbor_row", "distance"]
    _, ind = knn.radius_neighbors(X, Y, radius=0.6, metric="cosine")
    assert table.num_rows == sum(len(r) for r in ind) > 0


def test_vector_column_choice(kos_table):
    two = kos_table.append_column("other", kos_table.column("vec"))
    with pytest.raises(ValueError, match="left_column|several|vector column"):
        knn.kneighbors(two, k=2)
    d, i = knn.kneighbors(two, k=2, left_column="vec", right_column="other")
    assert i.shape == (300, 2)


def test_device_cpu_and_gpu(counts):
    X, Y = counts
    cpu = knn.kneighbors(X, Y, k=3, device="cpu")
    try:
        gpu = knn.kneighbors(X, Y, k=3, device="gpu")
    except ValueError as e:
        # No GPU here: an error that says so, never a silent fallback.
        assert "gpu" in str(e).lower() or "cuda" in str(e).lower(), str(e)
    else:
        assert np.allclose(gpu[0], cpu[0], atol=1e-5)
    auto = knn.kneighbors(X, Y, k=3, device="auto")
    assert np.allclose(auto[0], cpu[0], atol=1e-5)


def test_dim_is_the_matrix_width_for_metrics_that_need_it(counts, kos_table):
    X, Y = counts
    d, _ = knn.kneighbors(X, Y, k=2, metric="hamming")
    assert (d > 0).all() and (d <= 1).all()
    # Arrow data has no width: dim must be given, and the error says so.
    with pytest.raises(ValueError, match="dim"):
        knn.kneighbors(kos_table, k=2, metric="hamming")
    d, _ = knn.kneighbors(kos_table, k=2, metric="hamming", dim=KOS_DIM)
    assert d.shape == (300, 2)


BAD = sp.csr_matrix(np.array([[1.0, 0.0, np.nan], [0.0, 2.0, 1.0]]))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda X: knn.kneighbors(BAD, k=1), "NaN"),
        (lambda X: knn.kneighbors(-X, X, k=1, metric="jensenshannon"), "negative"),
        (lambda X: knn.kneighbors(X, k=1, metric="no_such_metric"), "no_such_metric"),
        (lambda X: knn.kneighbors(X, k=1, nonsense=3), "nonsense"),
        (lambda X: knn.kneighbors(X, k=1, metric="minkowski", p=0.5), "p must be"),
        (lambda X: knn.kneighbors(X, k=1, device="tpu"), "tpu"),
        (lambda X: knn.kneighbors(X, k=0), "k must be"),
        (lambda X: knn.kneighbors(X, k=-2), "k must be"),
        (lambda X: knn.kneighbors(X, k=10**6), "more than"),
        (lambda X: knn.kneighbors(X, k=2.5), "k must be"),
        (lambda X: knn.kneighbors("/no/such/file.parquet", X, k=1), "not an existing"),
        (lambda X: knn.kneighbors({"a": 1}, k=1), "expected a scipy.sparse matrix"),
        (lambda X: knn.kneighbors(np.zeros(3), k=1), "2-D"),
        (lambda X: knn.kneighbors(X, X[:, :5], k=1), "columns"),
        (lambda X: knn.kneighbors(pa.table({"a": [1, 2]}), k=1), "vector"),
        (lambda X: knn.radius_neighbors(X, radius=-1.0, metric="cosine"), "radius"),
        (lambda X: knn.knn_join(X, X, "cosine", 2, dim=0), "dim"),
    ],
    ids=["nan", "negative-js", "metric", "unknown-option", "p", "device", "k0", "k<0",
         "k>rows", "k-float", "missing-path", "bad-type", "1-D", "widths", "no-vector-column",
         "radius", "dim"],
)
def test_bad_input_raises_value_error(call, message, counts):
    X, _ = counts
    with pytest.raises(ValueError, match=message):
        call(X)


def test_errors_name_the_row():
    with pytest.raises(ValueError, match=r"row 0") as e:
        knn.kneighbors(BAD, sp.csr_matrix(np.eye(3)), k=1)
    assert "NaN" in str(e.value)
