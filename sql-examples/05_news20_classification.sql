-- Topic classification with kNN on the 20 Newsgroups bag of words, TF-IDF computed in SQL:
-- the word counts are unnested, weighted by (1 + ln tf) * ln(N / df), rebuilt into l2-normalised
-- sparse vectors, and the posts of the test split get their 10 nearest training posts by cosine
-- distance; a majority vote of those posts' newsgroups predicts the test post's newsgroup. The
-- bundled cut holds every 3rd training post (3772) and every 15th test post (503).
-- Run from the repository root:  sparse-knn sql sql-examples/05_news20_classification.sql
CREATE EXTERNAL TABLE news STORED AS PARQUET LOCATION 'data/news20_bow.parquet';

-- One row per (post, word); two unnests in one SELECT walk the lists side by side.
CREATE TABLE entries AS
SELECT doc_id, unnest(vec['indices']) AS word, unnest(vec['values']) AS tf FROM news;

CREATE TABLE idf AS
SELECT word, ln((SELECT count(*) FROM news) / count(*)::DOUBLE) AS idf
FROM entries GROUP BY word;

CREATE TABLE tfidf AS
SELECT n.doc_id, n.split, n.newsgroup, t.vec
FROM news n JOIN (
    -- Both array_aggs see the rows of a group in the same order, so indices and values stay
    -- paired; sparse_vector accepts unsorted indices (an ORDER BY here costs 200x the time).
    SELECT e.doc_id,
           sparse_normalize(sparse_vector(array_agg(e.word), array_agg((1 + ln(e.tf)) * i.idf)), 'l2') AS vec
    FROM entries e JOIN idf i ON e.word = i.word
    GROUP BY e.doc_id
) t ON n.doc_id = t.doc_id;

CREATE TABLE train AS SELECT doc_id, newsgroup, vec FROM tfidf WHERE split = 'train';
CREATE TABLE test AS
SELECT doc_id, newsgroup, vec FROM tfidf WHERE split = 'test';

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

-- Why neighbours are near: for three test posts, the words that weigh most in both the post and
-- its nearest training post (the products of their TF-IDF weights, whose sum is the cosine
-- similarity), named through the vocabulary file. The posts' headers are part of the counts, so
-- the rare words they share are often the poster's name and site: the same author, found again.
CREATE EXTERNAL TABLE vocab STORED AS PARQUET LOCATION 'data/news20_vocab.parquet';

CREATE TABLE nearest AS
SELECT query_doc_id AS doc, neighbor_doc_id AS neighbour, query_newsgroup AS newsgroup,
       neighbor_newsgroup AS neighbour_newsgroup, distance
FROM knn_join((SELECT * FROM test ORDER BY doc_id LIMIT 3), train, 'cosine', 1);

CREATE TABLE weights AS
SELECT doc_id, unnest(vec['indices']) AS word_id, unnest(vec['values']) AS w FROM tfidf;

SELECT doc, neighbour, newsgroup, neighbour_newsgroup, round(distance, 3) AS distance, word,
       round(weight, 4) AS weight
FROM (
    SELECT n.*, v.word, a.w * b.w AS weight,
           row_number() OVER (PARTITION BY n.doc ORDER BY a.w * b.w DESC, v.word) AS place
    FROM nearest n
    JOIN weights a ON a.doc_id = n.doc
    JOIN weights b ON b.doc_id = n.neighbour AND b.word_id = a.word_id
    JOIN vocab v ON v.word_id = a.word_id
)
WHERE place <= 5
ORDER BY doc, place;
