-- Lookups by key (BENCHMARKS.md, "Filtered right sides"): twenty one-row lookups whose left side
-- filters the right side's own table, in one session. Replace the path by a file of
-- `sparse-knn generate --shape nytimes --rows N --seed 0` and device=cpu by device=gpu as needed;
-- run with `sparse-knn sql --timing bench/sql/lookups_by_key.sql`; the first statement alone is
-- one lookup's process (`bench/sql/lookup_by_key_once.sql`).
CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '/tmp/bench48/nyt300k.parquet';
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 4242), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 17), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 99999), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 123456), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 250001), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 7), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 31337), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 200000), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 55555), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 1010), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 288888), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 42), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 160000), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 77777), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 3), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 299999), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 12345), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 98765), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 222222), docs, 'cosine', 10, 'device=cpu');
SELECT max(neighbor_id) FROM knn_join((SELECT * FROM docs WHERE id = 150150), docs, 'cosine', 10, 'device=cpu');
