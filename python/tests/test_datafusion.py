"""The functions inside datafusion-python: register(ctx), then SQL on registered tables and on
Parquet paths."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from datafusion import SessionContext

import datafusion_sparse_knn as knn
from conftest import KOS


@pytest.fixture()
def ctx(kos_table):
    ctx = SessionContext()
    knn.register(ctx)
    # An in-memory table: a table that datafusion-python itself reads from files (register_parquet)
    # cannot be scanned from the table function yet (README, "Known limits").
    ctx.register_record_batches("docs", [kos_table.to_batches()])
    return ctx


def rows(ctx, sql):
    return ctx.sql(sql).to_arrow_table()


def test_register_adds_every_scalar_function(ctx):
    names = {f.name for f in knn.scalar_functions()}
    assert {"sparse_distance", "sparse_parse", "sparse_format", "sparse_nnz", "sparse_norm",
            "sparse_normalize", "sparse_vector", "sparse_from_dense", "sparse_to_dense",
            "sparse_char_ngrams"} <= names
    got = rows(ctx, """
        SELECT sparse_distance(sparse_parse('{1:0.5,3:2}/5'), sparse_from_dense([0.5, 0, 1.0]),
                               'cosine') AS d,
               sparse_nnz(sparse_parse('{1:0.5,3:2}/5')) AS n,
               sparse_format(sparse_vector([4, 0], [1.5, 2.0])) AS f""").to_pylist()[0]
    # {0: 0.5, 2: 2} against {0: 0.5, 2: 1}: 1 - 2.25 / (sqrt(4.25) * sqrt(1.25))
    assert got["d"] == pytest.approx(1 - 2.25 / (np.sqrt(4.25) * np.sqrt(1.25)), abs=1e-6)
    assert got["n"] == 2
    assert got["f"].startswith("{1:2,5:1.5}")


def test_knn_join_on_a_registered_table(ctx):
    table = rows(ctx, "SELECT query_doc_id, neighbor_doc_id, distance, rank "
                      "FROM knn_join('docs', 'docs', 'cosine', 5) ORDER BY query_doc_id, rank")
    assert table.num_rows == 300 * 5
    assert table.schema.field("distance").type == pa.float64()
    assert table.schema.field("rank").type == pa.int32()
    # The same answer as kneighbors on the same file (doc_id is the row position there).
    distances, indices = knn.kneighbors(str(KOS), k=5, metric="cosine")
    assert np.array_equal(table.column("neighbor_doc_id").to_numpy().reshape(300, 5), indices)
    assert np.allclose(table.column("distance").to_numpy().reshape(300, 5), distances)
    assert np.array_equal(table.column("query_doc_id").to_numpy(), np.repeat(np.arange(300), 5))


def test_knn_join_on_a_parquet_path_and_options(ctx):
    sql = (f"SELECT query_doc_id, neighbor_doc_id, distance FROM knn_join('{KOS}', 'docs', "
           f"'minkowski', 3, 'p=3, exclude_self=true') ORDER BY query_doc_id, rank")
    table = rows(ctx, sql)
    assert table.num_rows == 900
    assert (table.column("query_doc_id").to_numpy() != table.column("neighbor_doc_id").to_numpy()).all()
    distances, indices = knn.kneighbors(str(KOS), k=3, metric="minkowski", p=3, exclude_self=True)
    assert np.allclose(table.column("distance").to_numpy(), distances.ravel())


def test_knn_join_on_in_memory_tables(ctx, kos_table):
    ctx.from_arrow(kos_table.slice(0, 20), name="queries")
    ctx.register_record_batches("corpus", [kos_table.to_batches()])
    table = rows(ctx, "SELECT * FROM knn_join('queries', 'corpus', 'jaccard', 4)")
    assert table.column_names == ["query_doc_id", "neighbor_doc_id", "distance", "rank"]
    assert table.num_rows == 80
    _, indices = knn.kneighbors(kos_table.slice(0, 20), kos_table, k=4, metric="jaccard")
    got = table.sort_by([("query_doc_id", "ascending"), ("rank", "ascending")])
    assert np.array_equal(got.column("neighbor_doc_id").to_numpy().reshape(20, 4), indices)


def test_radius_join(ctx):
    table = rows(ctx, "SELECT query_doc_id, neighbor_doc_id, distance "
                      "FROM radius_join('docs', 'docs', 'cosine', 0.5, 'exclude_self=true')")
    distances, indices = knn.radius_neighbors(str(KOS), radius=0.5, metric="cosine",
                                              exclude_self=True)
    assert table.num_rows == sum(len(i) for i in indices) > 0
    assert (table.column("distance").to_numpy() <= 0.5 * (1 + 1e-6)).all()


def test_sql_errors_carry_the_rust_message(ctx):
    with pytest.raises(Exception, match="neither a registered table"):
        rows(ctx, "SELECT * FROM knn_join('no_such_table', 'no_such_table', 'cosine', 3)")
    with pytest.raises(Exception, match="metric"):
        rows(ctx, "SELECT * FROM knn_join('docs', 'docs', 'no_such_metric', 3)")
