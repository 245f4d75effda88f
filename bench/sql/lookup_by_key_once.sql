-- One lookup by key, alone in its process (see bench/sql/lookups_by_key.sql).
CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '/tmp/bench48/nyt300k.parquet';
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 4242), docs, 'cosine', 10, 'device=cpu');
