"""`sparse-knn serve` from Python through ADBC's Flight SQL driver: the documented example
(docs/examples/serve_adbc.py) against a server this test starts on 127.0.0.1, its answers
against scipy's float64 cosine distances, and the server's refusals (token, paths, writes).

Needs the `sparse-knn` binary (built by `cargo test --release` in python/ci.sh's CI, or set
SPARSE_KNN_BIN) and `adbc-driver-flightsql`."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import adbc_driver_flightsql.dbapi as flight_sql
from adbc_driver_flightsql import DatabaseOptions
from conftest import csr_of

ROOT = Path(__file__).parents[2]
NEWS20 = ROOT / "data" / "news20_bow.parquet"
NEWS20_DIM = 173_762
EXAMPLE = ROOT / "docs" / "examples" / "serve_adbc.py"
TOKEN = "python-test-token-0123"


def _binary() -> Path:
    path = Path(os.environ.get("SPARSE_KNN_BIN", ROOT / "target" / "release" / "sparse-knn"))
    assert path.is_file(), f"{path} is missing: build it with `cargo build --release` or set SPARSE_KNN_BIN"
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server over a folder holding news20 as table `news`; yields its URL."""
    folder = tmp_path_factory.mktemp("served")
    (folder / "news").mkdir()
    (folder / "news" / "news20.parquet").write_bytes(NEWS20.read_bytes())
    token_file = folder / "token"
    token_file.write_text(TOKEN + "\n")
    process = subprocess.Popen(
        [_binary(), "serve", "--bind", "127.0.0.1:0", "--table", f"news={folder / 'news'}",
         "--token-file", token_file, "--max-statements", "4"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={k: v for k, v in os.environ.items() if k != "SPARSE_KNN_TOKEN"},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in process.stderr], daemon=True).start()
    url, seen = None, []
    try:
        while url is None:
            line = lines.get(timeout=60)
            seen.append(line)
            if "sparse-knn serve: listening on " in line:
                url = line.split("sparse-knn serve: listening on ")[1].split(";")[0]
        yield url, folder
    except queue.Empty:
        pytest.fail("sparse-knn serve did not start: " + "".join(seen))
    finally:
        process.kill()
        process.wait(timeout=60)


def _connect(url: str, token: str | None = TOKEN):
    options = {DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}"} if token else {}
    return flight_sql.connect(url, db_kwargs=options, autocommit=True)


def _query(url: str, sql: str, token: str | None = TOKEN):
    with _connect(url, token) as connection, connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetch_arrow_table()


@pytest.fixture(scope="module")
def news():
    table = pq.read_table(NEWS20)
    return table, csr_of(table, NEWS20_DIM)


def _cosine_reference(matrix, row: int) -> np.ndarray:
    """Float64 cosine distances of one row to every row."""
    q = matrix[row].toarray().ravel()
    norms = np.sqrt(np.asarray(matrix.multiply(matrix).sum(axis=1)).ravel()) * np.linalg.norm(q)
    return 1.0 - (matrix @ q) / norms


def test_the_documented_example_prints_the_nearest_posts_by_scipys_distances(server, news):
    url, _ = server
    env = dict(os.environ, SPARSE_KNN_SERVER=url, SPARSE_KNN_TOKEN=TOKEN)
    out = subprocess.run([sys.executable, EXAMPLE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 5, out.stdout
    table, matrix = news
    ids = table.column("doc_id").to_numpy()
    row = int(np.flatnonzero(ids == 4)[0])
    reference = _cosine_reference(matrix, row)
    for line in lines:
        rank, doc_id, distance, _ = line.split(maxsplit=3)
        at = int(np.flatnonzero(ids == int(doc_id))[0])
        assert abs(float(distance) - reference[at]) <= 1e-6 + 1e-6 * abs(reference[at]), line
    # Rank 1 is the post itself; the rest are the nearest others in order.
    assert lines[0].split()[1] == "4"
    got = [float(l.split()[2]) for l in lines]
    assert got == sorted(got)
    assert got[-1] <= np.sort(reference)[4] + 1e-6


def test_many_clients_side_by_side_get_the_answers_of_the_local_engine(server, news):
    import datafusion_sparse_knn as knn

    url, _ = server
    table, _ = news
    ids = [4, 97, 1000, 2500, 4000, 16, 640, 3334]  # news20's cut: ids 3 i + 1

    def served(doc_id):
        return _query(url, f"SELECT neighbor_doc_id, distance FROM knn_join("
                      f"(SELECT * FROM news WHERE doc_id = {doc_id}), news, 'cosine', 4) ORDER BY rank")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(served, ids))
    for doc_id, result in zip(ids, results):
        left = table.filter(table.column("doc_id").to_numpy() == doc_id)
        local = knn.knn_join(left, table, "cosine", 4).sort_by("rank")
        assert result.column("neighbor_doc_id").to_pylist() == local.column("neighbor_doc_id").to_pylist()
        np.testing.assert_array_equal(result.column("distance").to_numpy(), local.column("distance").to_numpy())


def test_a_missing_or_wrong_token_is_refused(server):
    url, _ = server
    for token in (None, "python-test-token-0124"):
        with pytest.raises(Exception, match="(?i)unauthenticated|token"):
            _query(url, "SELECT 1", token)


def test_paths_outside_the_served_folder_and_writes_are_refused(server):
    url, folder = server
    outside = NEWS20  # the repository's copy, not under the served folder
    with pytest.raises(Exception, match="outside the folders this server reads"):
        _query(url, f"SELECT count(*) FROM '{outside}'")
    with pytest.raises(Exception, match="outside the folders this server reads"):
        _query(url, f"SELECT count(*) FROM knn_join(news, '{folder}/news/../token', 'cosine', 1)")
    with pytest.raises(Exception, match="read-only"):
        _query(url, f"COPY (SELECT doc_id FROM news) TO '{folder}/news/copy.parquet'")
    assert not (folder / "news" / "copy.parquet").exists()
    assert _query(url, "SELECT count(*) AS n FROM news").column("n").to_pylist() == [4275]


def test_a_prepared_lookup_takes_its_key_as_a_parameter(server):
    url, _ = server
    template = ("SELECT neighbor_doc_id, distance FROM knn_join((SELECT * FROM news WHERE doc_id = $1), "
                "news, 'cosine', 4) ORDER BY rank")
    with _connect(url) as connection, connection.cursor() as cursor:
        bound = {}
        for doc_id in (4, 97, 1000):
            cursor.execute(template, parameters=(doc_id,))
            bound[doc_id] = cursor.fetch_arrow_table()
    for doc_id, result in bound.items():
        written_out = _query(url, template.replace("$1", str(doc_id)))
        assert result.num_rows == 4
        assert result.column("neighbor_doc_id").to_pylist() == written_out.column("neighbor_doc_id").to_pylist()
        assert result.column("distance").to_pylist() == written_out.column("distance").to_pylist()
    assert bound[4].column("neighbor_doc_id").to_pylist()[0] == 4
    # The same with a `?` placeholder, as JDBC and ODBC clients write it.
    with _connect(url) as connection, connection.cursor() as cursor:
        cursor.execute(template.replace("$1", "?"), parameters=(97,))
        marked = cursor.fetch_arrow_table()
    assert marked.column("neighbor_doc_id").to_pylist() == bound[97].column("neighbor_doc_id").to_pylist()
    assert marked.column("distance").to_pylist() == bound[97].column("distance").to_pylist()
