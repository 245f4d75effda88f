"""The functions inside datafusion-python: register(ctx), then SQL on registered tables and on
Parquet paths."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from datafusion import SessionConfig, SessionContext
from sklearn.neighbors import NearestNeighbors

import datafusion_sparse_knn as knn
from conftest import KOS


@pytest.fixture()
def ctx(kos_table):
    ctx = SessionContext()
    knn.register(ctx)
    ctx.register_record_batches("docs", [kos_table.to_batches()])
    return ctx


@pytest.fixture(params=[1, 4], ids=["1 partition", "4 partitions"])
def file_ctx(request, kos_table, tmp_path):
    """Tables that datafusion-python itself reads from files: Parquet, a listing table over a
    folder of three files, and a view over CSV (the vectors in pgvector's text form), next to
    the same rows in memory (``mem``)."""
    ctx = SessionContext(SessionConfig().with_target_partitions(request.param))
    knn.register(ctx)
    ctx.register_parquet("docs", str(KOS))
    folder = tmp_path / "kos"
    folder.mkdir()
    for i in range(3):
        pq.write_table(kos_table.slice(100 * i, 100), folder / f"part-{i}.parquet")
    ctx.register_listing_table("listed", str(folder), file_extension=".parquet")
    text = rows(ctx, "SELECT doc_id, sparse_format(vec) AS vec_text FROM docs ORDER BY doc_id")
    pcsv.write_csv(text, tmp_path / "kos.csv")
    ctx.register_csv("docs_csv", str(tmp_path / "kos.csv"))
    ctx.sql("CREATE VIEW from_csv AS SELECT doc_id, sparse_parse(vec_text) AS vec FROM docs_csv")
    ctx.register_record_batches("mem", [kos_table.to_batches()])
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


KNN_SQL = ("SELECT query_doc_id, neighbor_doc_id, distance, rank FROM knn_join({}, {}, '{}', {}) "
           "ORDER BY query_doc_id, rank")


@pytest.mark.parametrize("table", ["docs", "listed", "from_csv"])
def test_knn_join_on_tables_read_from_files(file_ctx, kos, table):
    # doc_id is the row position, so the join is scikit-learn's kneighbors of the KOS matrix.
    got = rows(file_ctx, KNN_SQL.format(f"'{table}'", f"'{table}'", "cosine", 5))
    assert got.num_rows == 300 * 5
    assert got.equals(rows(file_ctx, KNN_SQL.format("'mem'", "'mem'", "cosine", 5)))
    nn = NearestNeighbors(n_neighbors=5, metric="cosine", algorithm="brute").fit(kos)
    want_d, want_i = nn.kneighbors(kos)
    distances = got.column("distance").to_numpy().reshape(300, 5)
    assert np.allclose(distances, want_d, rtol=1e-4, atol=1e-6)
    indices = got.column("neighbor_doc_id").to_numpy().reshape(300, 5)
    # Equal distances may come in another order; the nearest (the row itself) may not.
    assert np.array_equal(indices[:, 0], want_i[:, 0])
    assert (indices == want_i).mean() > 0.95


def test_knn_join_between_a_file_table_and_a_path(file_ctx, kos):
    got = rows(file_ctx, KNN_SQL.format("'listed'", f"'{KOS}'", "manhattan", 3))
    assert got.equals(rows(file_ctx, KNN_SQL.format("'mem'", "'mem'", "manhattan", 3)))
    want_d, _ = NearestNeighbors(n_neighbors=3, metric="manhattan", algorithm="brute").fit(
        kos).kneighbors(kos)
    assert np.allclose(got.column("distance").to_numpy().reshape(300, 3), want_d, rtol=1e-4)


def test_radius_join_on_tables_read_from_files(file_ctx, kos):
    sql = ("SELECT query_doc_id, neighbor_doc_id, distance FROM radius_join('{}', '{}', 'cosine', "
           "0.6) ORDER BY query_doc_id, neighbor_doc_id")
    got = rows(file_ctx, sql.format("docs", "listed"))
    assert got.equals(rows(file_ctx, sql.format("mem", "mem")))
    nn = NearestNeighbors(radius=0.6, metric="cosine", algorithm="brute").fit(kos)
    want_d, want_i = nn.radius_neighbors(kos)
    assert got.num_rows == sum(len(i) for i in want_i) > 300
    pairs = {(q, j) for q, ind in enumerate(want_i) for j in ind}
    got_pairs = set(zip(got.column("query_doc_id").to_pylist(),
                        got.column("neighbor_doc_id").to_pylist()))
    # A pair at the radius itself may fall either side in float32; there are none this close.
    assert got_pairs == pairs


def test_a_file_table_joined_back_in_the_same_query(file_ctx):
    got = rows(file_ctx, """
        SELECT k.query_doc_id, count(*) AS n
        FROM knn_join('docs', 'from_csv', 'jaccard', 4, 'exclude_self=true') k
        JOIN docs d ON d.doc_id = k.neighbor_doc_id
        GROUP BY k.query_doc_id""")
    assert got.num_rows == 300
    assert set(got.column("n").to_pylist()) == {4}
    streamed = sum(batch.to_pyarrow().num_rows for batch in file_ctx.sql(
        "SELECT * FROM knn_join('listed', 'docs', 'cosine', 2)").execute_stream())
    assert streamed == 600


def test_a_table_on_a_registered_object_store_is_an_error_not_a_crash(tmp_path, kos_table):
    # README, "Known limits": the scan's session has DataFusion's default object stores only.
    from datafusion.object_store import LocalFileSystem

    pq.write_table(kos_table, tmp_path / "kos.parquet")
    ctx = SessionContext()
    knn.register(ctx)
    ctx.register_object_store("local://", LocalFileSystem(prefix=str(tmp_path)), None)
    ctx.register_parquet("remote", "local:///kos.parquet")
    assert rows(ctx, "SELECT count(*) AS n FROM remote").to_pylist() == [{"n": 300}]
    with pytest.raises(Exception, match="No suitable object store"):
        rows(ctx, "SELECT * FROM knn_join('remote', 'remote', 'cosine', 2)")
