-- Document similarity on a bag of words: for five KOS blog entries, the five most similar other
-- entries by cosine distance over their word counts (UCI Bag of Words, CC BY 4.0).
-- Run from the repository root:  sparse-knn sql sql-examples/01_document_similarity.sql
CREATE EXTERNAL TABLE kos STORED AS PARQUET LOCATION 'data/kos_bow.parquet';

-- The query documents; k = 6 because each one finds itself first, at distance 0.
CREATE TABLE kos_queries AS SELECT * FROM kos WHERE doc_id IN (10, 250, 1000, 2000, 3000);

SELECT query_doc_id,
       neighbor_doc_id,
       round(distance, 4) AS cosine_distance,
       rank - 1 AS rank
FROM knn_join(kos_queries, kos, 'cosine', 6)
WHERE query_doc_id <> neighbor_doc_id
ORDER BY query_doc_id, rank;
