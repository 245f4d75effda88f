-- Topic classification with kNN on the 20 Newsgroups bag of words: 400 posts of the test split
-- against the whole train split, cosine distance on TF (l2-normalised) vectors, then a majority
-- vote of the 10 nearest training posts' newsgroups predicts each test post's newsgroup.
-- Run from the repository root:  sparse-knn sql sql-examples/05_news20_classification.sql
CREATE EXTERNAL TABLE news STORED AS PARQUET LOCATION '../shared/data/news20_bow.parquet';

CREATE TABLE train AS SELECT doc_id, newsgroup, vec FROM news WHERE split = 'train';
CREATE TABLE test AS
SELECT doc_id, newsgroup, vec FROM news WHERE split = 'test' AND doc_id % 17 = 0 LIMIT 400;

CREATE TABLE votes AS
SELECT query_doc_id AS doc, query_newsgroup AS truth, neighbor_newsgroup AS vote, count(*) AS n
FROM knn_join(test, train, 'cosine', 10)
GROUP BY query_doc_id, query_newsgroup, neighbor_newsgroup;

CREATE TABLE predictions AS
SELECT doc, truth, vote AS predicted
FROM (SELECT *, row_number() OVER (PARTITION BY doc ORDER BY n DESC, vote) AS place FROM votes)
WHERE place = 1;

SELECT count(*) AS test_posts,
       round(avg(CASE WHEN predicted = truth THEN 1.0 ELSE 0.0 END), 3) AS accuracy
FROM predictions;

SELECT truth AS newsgroup, count(*) AS posts,
       round(avg(CASE WHEN predicted = truth THEN 1.0 ELSE 0.0 END), 3) AS accuracy
FROM predictions GROUP BY truth ORDER BY truth;
