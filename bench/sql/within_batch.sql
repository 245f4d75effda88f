-- within=g over a batch (BENCHMARKS.md, "Filtered right sides"): replace the path as in
-- filtered_lookups.sql; on the GPU the batch is `id % 100 = 1` of 1M rows, and `id % 10` the
-- 10-group variant. Run with `sparse-knn sql --timing bench/sql/within_batch.sql`.
CREATE EXTERNAL TABLE docs0 STORED AS PARQUET LOCATION '/tmp/bench48/nyt300k.parquet';
CREATE TABLE docs AS SELECT *, id % 997 AS g FROM docs0;
CREATE TABLE q AS SELECT * FROM docs WHERE id % 150 = 1;
SELECT count(*) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu');
SELECT count(*) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu');
SELECT count(*) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu, within=g');
SELECT count(*) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu, within=g');
SELECT count(*) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu');
SELECT count(*) FROM knn_join(q, docs, 'cosine', 10, 'device=cpu, within=g');
