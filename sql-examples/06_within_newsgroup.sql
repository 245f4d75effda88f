-- Neighbours within a group: each test post of the 20 Newsgroups cut gets its nearest training
-- posts of its own newsgroup (within=newsgroup), from the one index of the training posts (the
-- split is a filter, i.e. a row mask, and each newsgroup another). With raw word counts.
-- Run from the repository root:  sparse-knn sql sql-examples/06_within_newsgroup.sql
CREATE EXTERNAL TABLE news STORED AS PARQUET LOCATION 'data/news20_bow.parquet';

CREATE TABLE test_posts AS SELECT * FROM news WHERE split = 'test';

-- Every test post, 5 neighbours each, none from another newsgroup.
SELECT count(*) AS pairs,
       count(DISTINCT query_doc_id) AS posts,
       sum(CASE WHEN query_newsgroup <> neighbor_newsgroup THEN 1 ELSE 0 END) AS other_newsgroup
FROM knn_join(test_posts, (SELECT * FROM news WHERE split = 'train'), 'cosine', 5,
              'within=newsgroup');

-- The first three test posts: their three nearest training posts of the same newsgroup.
SELECT query_doc_id AS post,
       query_newsgroup AS newsgroup,
       neighbor_doc_id AS neighbour,
       round(distance, 4) AS cosine_distance,
       rank
FROM knn_join((SELECT * FROM test_posts WHERE doc_id IN
                  (SELECT doc_id FROM test_posts ORDER BY doc_id LIMIT 3)),
              (SELECT * FROM news WHERE split = 'train'), 'cosine', 3, 'within=newsgroup')
ORDER BY post, rank;
