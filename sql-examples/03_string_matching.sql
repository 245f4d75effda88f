-- String matching with hashed character n-grams (the paper's SEC EDGAR case, in SQL alone):
-- company names that start with 'AB' whose 3-gram count vectors are within cosine distance 0.25
-- of one another (case and spacing ignored): near-duplicate spellings and numbered series.
-- Run from the repository root:  sparse-knn sql sql-examples/03_string_matching.sql
CREATE EXTERNAL TABLE names STORED AS PARQUET LOCATION 'data/sec_edgar_names.parquet';

-- EDGAR pads names with runs of spaces before suffixes like '/BD'; collapsed first, or the
-- shared '   ' n-grams would make unrelated names look alike.
CREATE TABLE grams AS
SELECT name_id, name, sparse_char_ngrams(clean, 3) AS vec
FROM (SELECT name_id, regexp_replace(trim(name), '\s+', ' ', 'g') AS name,
             lower(regexp_replace(trim(name), '\s+', ' ', 'g')) AS clean
      FROM names)
WHERE name LIKE 'AB%'
ORDER BY name_id
LIMIT 2000;

SELECT count(*) AS names, sum(sparse_nnz(vec)) AS ngrams FROM grams;

-- Each unordered pair once, the pair of a name with itself left out.
SELECT query_name, neighbor_name, round(distance, 3) AS cosine_distance
FROM radius_join(grams, grams, 'cosine', 0.25)
WHERE query_name_id < neighbor_name_id
ORDER BY distance, query_name
LIMIT 25;
