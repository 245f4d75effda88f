-- A self kNN graph: the 10 nearest neighbours of every KOS blog entry among all the others
-- (exclude_self drops the pair of a row with itself), then properties of the graph: how many
-- edges are mutual and how distance grows with rank.
-- Run from the repository root:  sparse-knn sql sql-examples/02_knn_graph.sql
CREATE EXTERNAL TABLE kos STORED AS PARQUET LOCATION 'data/kos_bow.parquet';

-- l2-normalised rows make euclidean distance a monotone function of cosine similarity.
CREATE TABLE docs AS SELECT doc_id, sparse_normalize(vec, 'l2') AS vec FROM kos;

CREATE TABLE graph AS
SELECT query_doc_id AS src, neighbor_doc_id AS dst, distance, rank
FROM knn_join(docs, docs, 'euclidean', 10, 'exclude_self=true');

SELECT count(*) AS edges,
       count(DISTINCT src) AS nodes,
       sum(CASE WHEN src = dst THEN 1 ELSE 0 END) AS self_loops
FROM graph;

-- An edge is mutual when dst also lists src among its own 10 neighbours.
SELECT round(avg(CASE WHEN b.src IS NULL THEN 0.0 ELSE 1.0 END), 3) AS mutual_edge_share
FROM graph a LEFT JOIN graph b ON a.src = b.dst AND a.dst = b.src;

SELECT rank, round(avg(distance), 4) AS mean_distance, round(max(distance), 4) AS max_distance
FROM graph GROUP BY rank ORDER BY rank;
