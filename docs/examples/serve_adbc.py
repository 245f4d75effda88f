"""Query a `sparse-knn serve` server from Python with ADBC's Flight SQL driver.

    pip install adbc-driver-flightsql pyarrow
    sparse-knn serve --table news=data/news20_bow.parquet --token-file token.txt &
    SPARSE_KNN_SERVER=grpc://127.0.0.1:50051 SPARSE_KNN_TOKEN="$(cat token.txt)" \
        python3 docs/examples/serve_adbc.py

Prints the five nearest newsgroup posts of post 4 by cosine distance, as the server's shared
session (and its kept index) answers them. python/tests/test_serve.py runs this file.
"""

import os

import adbc_driver_flightsql.dbapi as flight_sql
from adbc_driver_flightsql import DatabaseOptions

url = os.environ.get("SPARSE_KNN_SERVER", "grpc://127.0.0.1:50051")
token = os.environ.get("SPARSE_KNN_TOKEN")
options = {DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}"} if token else {}

with flight_sql.connect(url, db_kwargs=options, autocommit=True) as connection:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT neighbor_doc_id, neighbor_newsgroup, distance, rank
            FROM knn_join((SELECT * FROM news WHERE doc_id = 4), news, 'cosine', 5)
            ORDER BY rank
            """
        )
        table = cursor.fetch_arrow_table()

for row in table.to_pylist():
    print(f"{row['rank']}  {row['neighbor_doc_id']:>5}  {row['distance']:.6f}  {row['neighbor_newsgroup']}")
