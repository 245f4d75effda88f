-- Jensen-Shannon neighbours of single cells: UMI counts of FACS-purified PBMCs (Zheng et al.
-- 2017, CC BY 4.0; the bundled cut holds 1258 of the 3774 cells) are l1-normalised into
-- expression profiles, and each of 300 cells gets its 15 nearest cells by Jensen-Shannon
-- distance. The FACS cell type is a ground truth: a majority vote of the neighbours' types
-- predicts the query's type (B, NK, CD34+ and cytotoxic cells come out well; the CD4+ T-cell
-- subsets are famously hard to tell apart on counts alone).
-- Run from the repository root:  sparse-knn sql sql-examples/04_jensen_shannon.sql
CREATE EXTERNAL TABLE facs STORED AS PARQUET LOCATION 'data/pbmc_facs_counts.parquet';

CREATE TABLE cells AS
SELECT row_number() OVER () AS cell, barcode, celltype, sparse_normalize(vec, 'l1') AS vec
FROM facs;

-- Every 4th cell as a query; k = 16 because each query finds itself first.
CREATE TABLE query_cells AS SELECT * FROM cells WHERE cell % 4 = 0 LIMIT 300;

CREATE TABLE neighbours AS
SELECT query_cell, query_celltype, neighbor_celltype, distance, rank
FROM knn_join(query_cells, cells, 'jensenshannon', 16)
WHERE query_cell <> neighbor_cell;

SELECT query_cell, query_celltype, neighbor_celltype, round(distance, 4) AS js_distance, rank - 1 AS rank
FROM neighbours
WHERE query_cell IN (12, 24)
ORDER BY query_cell, rank;

-- kNN classification by majority vote of the 15 neighbours.
WITH votes AS (
    SELECT query_cell, query_celltype, neighbor_celltype, count(*) AS n
    FROM neighbours GROUP BY query_cell, query_celltype, neighbor_celltype
), winner AS (
    SELECT query_cell, query_celltype, neighbor_celltype AS predicted,
           row_number() OVER (PARTITION BY query_cell ORDER BY n DESC, neighbor_celltype) AS place
    FROM votes
)
SELECT query_celltype AS celltype,
       count(*) AS queries,
       round(avg(CASE WHEN predicted = query_celltype THEN 1.0 ELSE 0.0 END), 3) AS accuracy
FROM winner WHERE place = 1
GROUP BY query_celltype ORDER BY query_celltype;
