-- Filtered lookups, lookups by key, batches and within=g against 11M kept rows on a GPU (BENCHMARKS.md,
-- "Filtered right sides", the H200 column): the path is a file of `sparse-knn generate --shape
-- nytimes --rows 11000000 --seed 0`; run with `sparse-knn sql --timing bench/sql/filtered_gpu_11m.sql`.
CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '/tmp/serve/nytimes_11000000.parquet';
CREATE TABLE q AS SELECT * FROM docs WHERE id = 4242;
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 2 = 0), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 10 = 3), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 100 = 5), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 1000 = 6), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 10000 = 7), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id < 5500000), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id >= 9900000), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id BETWEEN 5000000 AND 5109999), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id BETWEEN 6000000 AND 6010999), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id BETWEEN 7000000 AND 7001099), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join(q, docs, 'cosine', 10, 'device=gpu');
EXPLAIN ANALYZE SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id % 10 = 8), 'cosine', 10, 'device=gpu');
EXPLAIN ANALYZE SELECT max(neighbor_id) FROM knn_join(q, (SELECT * FROM docs WHERE id BETWEEN 3000000 AND 4099999), 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 4242), docs, 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 777), docs, 'cosine', 10, 'device=gpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 123457), docs, 'cosine', 10, 'device=gpu');
CREATE TABLE q10k AS SELECT * FROM docs WHERE id % 1100 = 1 LIMIT 10000;
SELECT count(*), max(neighbor_id) FROM knn_join(q10k, docs, 'cosine', 10, 'device=gpu');
SELECT count(*), max(neighbor_id) FROM knn_join(q10k, docs, 'cosine', 10, 'device=gpu');
SELECT count(*), max(neighbor_id) FROM knn_join(q10k, (SELECT * FROM docs WHERE id % 10 = 3), 'cosine', 10, 'device=gpu');
SELECT count(*), max(neighbor_id) FROM knn_join(q10k, (SELECT * FROM docs WHERE id % 10 = 3), 'cosine', 10, 'device=gpu');
SELECT count(*), max(neighbor_id) FROM knn_join(q10k, docs, 'cosine', 10, 'device=gpu');
SELECT count(*), max(neighbor_g) FROM knn_join((SELECT *, id % 997 AS g FROM q10k), (SELECT *, id % 997 AS g FROM docs), 'cosine', 10, 'device=gpu');
SELECT count(*), max(neighbor_g) FROM knn_join((SELECT *, id % 997 AS g FROM q10k), (SELECT *, id % 997 AS g FROM docs), 'cosine', 10, 'device=gpu');
SELECT count(*), max(neighbor_g) FROM knn_join((SELECT *, id % 997 AS g FROM q10k), (SELECT *, id % 997 AS g FROM docs), 'cosine', 10, 'device=gpu, within=g');
SELECT count(*), max(neighbor_g) FROM knn_join((SELECT *, id % 997 AS g FROM q10k), (SELECT *, id % 997 AS g FROM docs), 'cosine', 10, 'device=gpu, within=g');
SELECT count(*), max(neighbor_g) FROM knn_join((SELECT *, id % 997 AS g FROM q10k), (SELECT *, id % 997 AS g FROM docs), 'cosine', 10, 'device=gpu');
