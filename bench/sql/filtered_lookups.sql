-- Filtered one-row lookups (BENCHMARKS.md, "Filtered right sides"): replace the path by a file of
-- `sparse-knn generate --shape nytimes --rows N --seed 0` and device=cpu by device=gpu as needed;
-- run with `sparse-knn sql --timing bench/sql/filtered_lookups.sql`.
CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '/tmp/bench48/nyt300k.parquet';
CREATE TABLE q AS SELECT * FROM docs WHERE id = 4242;
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 2 = 0), 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 10 = 3), 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 100 = 5), 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 1000 = 6), 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 10000 = 7), 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 10 = 4), 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu');
