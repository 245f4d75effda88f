//! A file added to a folder is seen by the next statement (issue "Data that grows", item 4): by
//! `knn_join` and a plain `SELECT` alike, in a session from `session_context()` and in one
//! `sparse-knn sql` process. DataFusion's default keeps a folder's first listing for the
//! session's life; these sessions list it again.

use std::process::Command;

use crate::common::{self, collect, counts, write_parquet};

#[tokio::test]
async fn a_new_file_in_a_folder_is_seen_by_the_next_statement() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("docs");
    std::fs::create_dir(&folder).unwrap();
    write_parquet(&folder.join("part0.parquet"), &counts(150, 61), 0);
    write_parquet(&folder.join("part1.parquet"), &counts(150, 62), 150);
    let query_row = counts(1, 63);
    let query = dir.path().join("q.parquet");
    write_parquet(&query, &query_row, 5000);

    let ctx = datafusion_sparse_knn::session_context();
    ctx.sql(&format!(
        "CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '{}/'",
        folder.display()
    ))
    .await
    .unwrap();
    ctx.register_parquet("q", query.to_str().unwrap(), Default::default())
        .await
        .unwrap();
    let count = "SELECT count(*) AS n FROM docs";
    let nearest = "SELECT * FROM knn_join(q, docs, 'cosine', 1, 'device=cpu')";
    let rows = |batches: &[arrow::array::RecordBatch]| {
        arrow::compute::cast(batches[0].column(0), &arrow::datatypes::DataType::Int64)
            .unwrap()
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .unwrap()
            .value(0)
    };
    assert_eq!(rows(&collect(&ctx, count).await), 300);
    let before = common::pairs(&collect(&ctx, nearest).await);
    assert!(
        before[0].2 > 1e-6,
        "no copy of the query row yet: {before:?}"
    );

    // A copy of the query row arrives in a new file.
    write_parquet(&folder.join("part2.parquet"), &query_row, 9999);
    assert_eq!(rows(&collect(&ctx, count).await), 301);
    let after = common::pairs(&collect(&ctx, nearest).await);
    assert_eq!(after[0].1, 9999, "the new file's row: {after:?}");
    assert!(after[0].2.abs() < 1e-12, "{after:?}");

    // A removed file's rows go too.
    std::fs::remove_file(folder.join("part0.parquet")).unwrap();
    assert_eq!(rows(&collect(&ctx, count).await), 151);
}

#[test]
fn one_cli_process_sees_the_file_its_own_statement_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("f");
    std::fs::create_dir(&folder).unwrap();
    write_parquet(&folder.join("a.parquet"), &counts(40, 64), 0);
    let script = format!(
        "SELECT count(*) AS n FROM '{f}/';\n\
         COPY (SELECT id + 1000 AS id, v FROM '{f}/' WHERE id < 3) TO '{f}/b.parquet';\n\
         SELECT count(*) AS n FROM '{f}/';\n",
        f = folder.display()
    );
    let exe = crate::common::sparse_knn_bin();
    let out = Command::new(exe)
        .args(["sql", "--format", "csv", "-c", &script])
        .output()
        .unwrap();
    let (stdout, counts) = printed_counts(&out);
    let counts: Vec<&str> = counts.iter().map(String::as_str).collect();
    assert_eq!(counts.first(), Some(&"40"), "{stdout}");
    assert_eq!(counts.last(), Some(&"43"), "{stdout}");
}

/// `(index_built, index_reused, index_segments, rows_indexed)` of `sql`'s join.
async fn segment_counters(ctx: &datafusion::prelude::SessionContext, sql: &str) -> [usize; 4] {
    let c = common::explain_counters(
        ctx,
        sql,
        &[
            "index_built",
            "index_reused",
            "index_segments",
            "rows_indexed",
        ],
    )
    .await;
    [c[0], c[1], c[2], c[3]]
}

/// (query id, neighbor id, distance bits, rank): a side in segments must give a fresh build's bits.
pub(crate) fn answer(batches: &[arrow::array::RecordBatch]) -> Vec<(i64, i64, u64, i32)> {
    common::pairs(batches)
        .into_iter()
        .map(|(q, n, d, r)| (q, n, d.to_bits(), r))
        .collect()
}

/// A session without the index cache: every statement a fresh build over the files as they are.
pub(crate) async fn uncached_session() -> datafusion::prelude::SessionContext {
    let ctx = datafusion_sparse_knn::session_context();
    collect(&ctx, "SET sparse_knn.index_cache = '0'").await;
    ctx
}

fn metric_options(kind: datafusion_sparse_knn::metric::MetricKind) -> &'static str {
    use datafusion_sparse_knn::metric::MetricKind;
    match kind {
        MetricKind::Minkowski => ", p=3",
        k if k.needs_dim() => ", dim=60",
        _ => "",
    }
}

/// How far `kind`'s distances of these rows (integer counts) may be from a fresh build's: None
/// where they are bit for bit whatever the index's layout (sums of integers, exact in any order, a
/// max, or the certified metrics' exact step). Canberra's fractions and kl's logarithms are summed
/// in an order that follows the columns an index keeps dense, which differ between a segment and a
/// side built whole: a few units in the last place. On the GPU, dot and cosine multiply the columns
/// a side keeps dense on the tensor cores, in a precision chosen by that side's values, which keeps
/// float32 accuracy (the `dense_columns` option; 1.6e-7 relative measured on an H200).
pub(crate) fn rounding(
    kind: datafusion_sparse_knn::metric::MetricKind,
    device: &str,
) -> Option<f64> {
    use datafusion_sparse_knn::metric::MetricKind;
    match (device, kind) {
        ("gpu", MetricKind::Dot | MetricKind::Cosine) => Some(1e-6),
        ("cpu", MetricKind::Canberra | MetricKind::KlDivergence) => Some(1e-12),
        _ => None,
    }
}

/// `got` and `want` (query, neighbor, distance bits, rank) agree but for rounding: the same
/// queries and ranks, distances within `tolerance` relative, and the same neighbors wherever a
/// distance is not within that of the k-th (where rounding may swap a tie).
pub(crate) fn assert_equal_but_rounding(
    got: &[(i64, i64, u64, i32)],
    want: &[(i64, i64, u64, i32)],
    tolerance: f64,
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}");
    let close =
        |a: f64, b: f64| a == b || (a - b).abs() <= tolerance * a.abs().max(b.abs()).max(1.0);
    for (g, w) in got.iter().zip(want) {
        let (dg, dw) = (f64::from_bits(g.2), f64::from_bits(w.2));
        assert_eq!((g.0, g.3), (w.0, w.3), "{what}: {g:?} against {w:?}");
        assert!(close(dg, dw), "{what}: {g:?} against {w:?}");
    }
    for query in got.iter().map(|p| p.0) {
        let of = |pairs: &[(i64, i64, u64, i32)]| -> Vec<(i64, f64)> {
            pairs
                .iter()
                .filter(|p| p.0 == query)
                .map(|p| (p.1, f64::from_bits(p.2)))
                .collect()
        };
        let (g, w) = (of(got), of(want));
        let kth = w.last().map_or(0.0, |p| p.1);
        let sure = |pairs: &[(i64, f64)]| -> Vec<i64> {
            let mut ids: Vec<i64> = pairs
                .iter()
                .filter(|p| p.1 < kth && !close(p.1, kth))
                .map(|p| p.0)
                .collect();
            ids.sort_unstable();
            ids
        };
        assert_eq!(sure(&g), sure(&w), "{what}: query {query}");
    }
}

/// Waits (at most 60 s) until no merge of segments runs in `ctx`'s cache.
async fn merges_done(ctx: &datafusion::prelude::SessionContext) {
    let cache = ctx
        .state()
        .config()
        .get_extension::<datafusion_sparse_knn::index::IndexCache>()
        .expect("the session has an index cache");
    for _ in 0..600 {
        if cache.merges_in_flight() == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("a merge of segments still runs after 60 s");
}

#[tokio::test]
async fn a_growing_folder_is_held_in_segments_that_answer_like_a_fresh_build_for_every_metric() {
    for kind in datafusion_sparse_knn::metric::MetricKind::all() {
        grow_shrink_and_rewrite(kind, "cpu").await;
    }
}

/// On the GPU the segments are GPU indexes probed one after the other; their merged answer is a
/// fresh GPU build's, bit for bit (the kernels' sums are exact in any order).
#[tokio::test]
#[ignore = "needs a CUDA GPU"]
async fn a_growing_folder_on_the_gpu_answers_like_a_fresh_build() {
    for kind in datafusion_sparse_knn::metric::MetricKind::all() {
        grow_shrink_and_rewrite(kind, "gpu").await;
    }
}

/// A folder of two files (the side built whole), a file added (a segment of its own, a tie
/// with a row of the first file), rewritten (its segment built again), a file of the first
/// segment removed (the rest of it built again), then merged: each answer equal to a fresh
/// build's over the files as they are.
async fn grow_shrink_and_rewrite(kind: datafusion_sparse_knn::metric::MetricKind, device: &str) {
    {
        let metric = kind.name();
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("docs");
        std::fs::create_dir(&folder).unwrap();
        let a = counts(120, 81);
        write_parquet(&folder.join("a.parquet"), &a, 0);
        write_parquet(&folder.join("b.parquet"), &counts(120, 82), 1000);
        // Query rows: new ones and a copy of a row of a.parquet, which c.parquet copies again
        // (a tie: the earlier row in file order comes first).
        let pick = (0..a.len())
            .find(|&i| a[i].as_ref().is_some_and(|r| r.len() >= 3))
            .unwrap() as i64;
        let mut queries = counts(5, 83);
        queries.push(a[pick as usize].clone());
        let query = dir.path().join("q.parquet");
        write_parquet(&query, &queries, 5000);
        let cached = datafusion_sparse_knn::session_context();
        let fresh = uncached_session().await;
        let sql = format!(
            "SELECT * FROM knn_join('{q}', '{f}/', '{metric}', 7, 'device={device}{o}') \
             ORDER BY query_id, rank",
            q = query.display(),
            f = folder.display(),
            o = metric_options(kind)
        );
        let same_as_fresh = |step: &'static str| {
            let (cached, fresh, sql) = (&cached, &fresh, &sql);
            async move {
                let got = answer(&collect(cached, sql).await);
                let want = answer(&collect(fresh, sql).await);
                assert!(got.len() >= 6 * 7, "{metric} {step}: {} pairs", got.len());
                match rounding(kind, device) {
                    None => assert_eq!(got, want, "{metric} {step}"),
                    Some(tolerance) => assert_equal_but_rounding(
                        &got,
                        &want,
                        tolerance,
                        &format!("{metric} {step}"),
                    ),
                }
                got
            }
        };
        assert_eq!(
            segment_counters(&cached, &sql).await,
            [1, 0, 1, 240],
            "{metric}"
        );
        same_as_fresh("built whole").await;

        // A new file: a segment of its own; the first segment kept.
        let mut c = counts(120, 84);
        c[3] = a[pick as usize].clone();
        write_parquet(&folder.join("c.parquet"), &c, 2000);
        assert_eq!(
            segment_counters(&cached, &sql).await,
            [1, 1, 2, 120],
            "{metric}"
        );
        let grown = same_as_fresh("a file added").await;
        // The copies of the query row in a.parquet (id `pick`) and c.parquet (id 2003) tie: the
        // earlier in file order ranks first.
        let rank_of = |id: i64| {
            grown
                .iter()
                .find(|p| p.0 == 5005 && p.1 == id)
                .map(|p| (p.2, p.3))
        };
        match (rank_of(pick), rank_of(2003)) {
            (Some((d7, r7)), Some((d2003, r2003))) => {
                assert_eq!(d7, d2003, "{metric}: the copies' distances");
                assert!(
                    r7 < r2003,
                    "{metric}: the tie goes to the earlier file's row"
                );
            }
            (None, None) => assert!(kind.is_similarity(), "{metric}: no copy found"),
            other => panic!("{metric}: one copy of a tie without the other: {other:?}"),
        }
        if kind.name() == "cosine" {
            assert!(rank_of(pick).unwrap().1 <= 3, "{grown:?}");
        }

        // The new file rewritten: its segment alone is built again.
        write_parquet(&folder.join("c.parquet"), &counts(90, 85), 3000);
        assert_eq!(
            segment_counters(&cached, &sql).await,
            [1, 1, 2, 90],
            "{metric}"
        );
        same_as_fresh("a file rewritten").await;

        // A file of the first segment removed: the rest of that segment is built again.
        std::fs::remove_file(folder.join("a.parquet")).unwrap();
        assert_eq!(
            segment_counters(&cached, &sql).await,
            [1, 1, 2, 120],
            "{metric}"
        );
        same_as_fresh("a file removed").await;
        merges_done(&cached).await;
        same_as_fresh("merged").await;
    }
}

#[tokio::test]
async fn files_added_one_by_one_merge_into_few_segments_beside_the_queries() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("docs");
    std::fs::create_dir(&folder).unwrap();
    write_parquet(&folder.join("part000.parquet"), &counts(400, 91), 0);
    let query = dir.path().join("q.parquet");
    write_parquet(&query, &counts(8, 92), 90_000);
    let cached = datafusion_sparse_knn::session_context();
    let fresh = uncached_session().await;
    for ctx in [&cached, &fresh] {
        let table = format!(
            "CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '{}/'",
            folder.display()
        );
        collect(ctx, &table).await;
    }
    let knn = |metric: &str| {
        format!(
            "SELECT * FROM knn_join('{}', '{}/', '{metric}', 5, 'device=cpu') \
             ORDER BY query_id, rank",
            query.display(),
            folder.display()
        )
    };
    // A filtered right side over the same files: its mask is read over every file.
    let filtered = format!(
        "SELECT * FROM knn_join('{}', (SELECT * FROM docs WHERE id % 3 <> 0), 'manhattan', 4, \
         'device=cpu') ORDER BY query_id, rank",
        query.display(),
    );
    assert_eq!(
        segment_counters(&cached, &knn("cosine")).await[..3],
        [1, 0, 1]
    );
    let mut most = 0;
    for file in 1..=12 {
        write_parquet(
            &folder.join(format!("part{file:03}.parquet")),
            &counts(20, 100 + file),
            1000 * file as i64,
        );
        let [built, reused, segments, indexed] = segment_counters(&cached, &knn("cosine")).await;
        assert_eq!(
            (built, reused, indexed),
            (1, segments - 1, 20),
            "file {file}"
        );
        most = most.max(segments);
        merges_done(&cached).await;
        let got = answer(&collect(&cached, &knn("cosine")).await);
        assert_eq!(
            got,
            answer(&collect(&fresh, &knn("cosine")).await),
            "file {file}"
        );
        let got = answer(&collect(&cached, &filtered).await);
        assert_eq!(
            got,
            answer(&collect(&fresh, &filtered).await),
            "filtered, file {file}"
        );
    }
    // 13 files: one of 400 rows, 12 of 20 merged like a binary counter's carries.
    let [built, reused, segments, _] = segment_counters(&cached, &knn("cosine")).await;
    assert_eq!((built, reused), (0, 1));
    assert!(segments <= 4, "{segments} segments after the merges");
    assert!(most <= 5, "at most {most} segments before the merges");
}

/// A folder of hundreds of files, named in SQL as a path: planning reads every file's footer from
/// a blocking poll inside the statement's task, whose cooperative budget ran out past about 120
/// files (the CLI then spun forever). Bounded: the process is killed after 120 s.
#[test]
fn a_folder_of_hundreds_of_files_plans_and_joins_in_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("many");
    std::fs::create_dir(&folder).unwrap();
    let rows = counts(600, 95);
    for (i, pair) in rows.chunks(2).enumerate() {
        write_parquet(
            &folder.join(format!("part{i:04}.parquet")),
            pair,
            2 * i as i64,
        );
    }
    let script = format!(
        "SELECT count(*) AS n FROM '{f}/';\n\
         SELECT count(*) AS n FROM knn_join((SELECT * FROM '{f}/' WHERE id < 4), '{f}/', \
         'cosine', 3, 'device=cpu');\n",
        f = folder.display()
    );
    let exe = crate::common::sparse_knn_bin();
    let mut child = Command::new(exe)
        .args(["sql", "--format", "csv", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("sparse-knn sql over a folder of 300 files still runs after 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, counts) = printed_counts(&out);
    let counts: Vec<&str> = counts.iter().map(String::as_str).collect();
    // Every row, and 3 neighbours of each of the 4 query rows (ids 0-3) that have a column.
    assert_eq!(counts.first(), Some(&"600"), "{stdout}");
    let pairs: usize = counts[1].parse().unwrap();
    let with_columns = rows[..4]
        .iter()
        .filter(|r| r.as_ref().is_some_and(|r| !r.is_empty()))
        .count();
    assert!(
        with_columns > 0 && (3 * with_columns..=12).contains(&pairs),
        "{pairs} pairs for {with_columns} query rows with columns: {stdout}"
    );
}

/// A `sparse-knn sql --format csv` run that succeeded: its output, and the lines that are a
/// number (the counts its statements printed).
fn printed_counts(out: &std::process::Output) -> (String, Vec<String>) {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts = stdout
        .lines()
        .filter(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_string)
        .collect();
    (stdout, counts)
}
