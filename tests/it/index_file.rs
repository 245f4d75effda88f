//! Index files and the index value (SPEC, "Indexes that outlive a statement"): a `.skidx` file
//! written by `sparse-knn index` or `SparseIndex::save` is loaded, not rebuilt, wherever a join's
//! right input may be a path, and answers bit for bit as the source data does, with the same
//! output columns; a metric it was not built for, and a damaged, cut or foreign file, are errors
//! naming the file; the index value is probed directly, through a DataFrame and as a table.
//! On the GPU (`-- --ignored` on a machine with one): a reused, loaded or held GPU index answers
//! bit for bit as a fresh GPU build does, for every metric.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{collect, counts, explain_counters, write_parquet};
use arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;
use datafusion_sparse_knn::index::SparseIndex;
use datafusion_sparse_knn::join::{PairList, ProbeOptions, Selection};
use datafusion_sparse_knn::metric::MetricKind;

fn answer(batches: &[RecordBatch]) -> Vec<(i64, i64, u64, i32)> {
    common::pairs(batches)
        .into_iter()
        .map(|(q, n, d, r)| (q, n, d.to_bits(), r))
        .collect()
}

/// (query id, neighbor id, distance bits) of a direct probe whose left rows have ids from
/// `first_id` and whose right rows' ids are their positions.
fn direct(pairs: &PairList, first_id: i64) -> Vec<(i64, i64, u64)> {
    (0..pairs.len())
        .map(|i| {
            (
                first_id + pairs.left[i] as i64,
                pairs.right[i] as i64,
                pairs.distance[i].to_bits(),
            )
        })
        .collect()
}

fn without_rank(batches: &[RecordBatch]) -> Vec<(i64, i64, u64)> {
    answer(batches).iter().map(|p| (p.0, p.1, p.2)).collect()
}

fn options_for(kind: MetricKind) -> &'static str {
    match kind {
        MetricKind::Minkowski => "p=3",
        k if k.needs_dim() => "dim=60",
        _ => "",
    }
}

/// A corpus of 400 rows of raw counts and 30 query rows, as Parquet files in `dir`.
fn data(dir: &Path) -> (PathBuf, PathBuf) {
    let corpus = dir.join("corpus.parquet");
    let queries = dir.join("queries.parquet");
    write_parquet(&corpus, &counts(400, 11), 0);
    write_parquet(&queries, &counts(30, 12), 10_000);
    (corpus, queries)
}

async fn session_with_queries(queries: &Path) -> SessionContext {
    let ctx = datafusion_sparse_knn::session_context();
    ctx.register_parquet("l", queries.to_str().unwrap(), Default::default())
        .await
        .unwrap();
    ctx
}

async fn index_of(
    ctx: &SessionContext,
    corpus: &Path,
    metrics: &[&str],
    options: &str,
) -> SparseIndex {
    let frame = ctx
        .read_parquet(corpus.to_str().unwrap(), Default::default())
        .await
        .unwrap();
    SparseIndex::build(frame, metrics, options).await.unwrap()
}

fn knn_sql(right: &str, metric: &str, k: usize, options: &str) -> String {
    format!(
        "SELECT * FROM knn_join(l, '{right}', '{metric}', {k}, 'device=cpu, {options}') \
         ORDER BY query_id, rank"
    )
}

#[tokio::test]
async fn a_loaded_index_answers_bit_for_bit_like_its_source_for_every_metric() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, queries) = data(dir.path());
    let ctx = session_with_queries(&queries).await;
    let corpus_path = corpus.to_str().unwrap();
    for kind in MetricKind::all() {
        let options = options_for(kind);
        let file = dir.path().join(format!("{}.skidx", kind.name()));
        index_of(&ctx, &corpus, &[kind.name()], options)
            .await
            .save(&file)
            .unwrap();
        let file = file.to_str().unwrap();
        let fresh = collect(&ctx, &knn_sql(corpus_path, kind.name(), 7, options)).await;
        let sql = knn_sql(file, kind.name(), 7, options);
        let loaded = collect(&ctx, &sql).await;
        assert_eq!(answer(&fresh), answer(&loaded), "{}", kind.name());
        assert_eq!(fresh[0].schema(), loaded[0].schema(), "{}", kind.name());
        let counters =
            explain_counters(&ctx, &sql, &["index_built", "index_loaded", "index_reused"]).await;
        // The first statement loaded it; this one takes it from the session's cache.
        assert_eq!(counters, vec![0, 0, 1], "{}", kind.name());
        let fresh_ctx = session_with_queries(&queries).await;
        let counters = explain_counters(
            &fresh_ctx,
            &sql,
            &["index_built", "index_loaded", "index_reused"],
        )
        .await;
        assert_eq!(
            counters,
            vec![0, 1, 0],
            "{}: a new session loads it",
            kind.name()
        );
    }
    // A radius join over the same file.
    let file = dir.path().join("manhattan.skidx");
    let radius = |right: &str| {
        format!(
            "SELECT * FROM radius_join(l, '{right}', 'manhattan', 9000, 'device=cpu') \
             ORDER BY query_id, neighbor_id"
        )
    };
    let fresh = collect(&ctx, &radius(corpus_path)).await;
    let loaded = collect(&ctx, &radius(file.to_str().unwrap())).await;
    assert!(!answer(&fresh).is_empty());
    assert_eq!(answer(&fresh), answer(&loaded));
}

#[tokio::test]
async fn an_index_value_is_probed_saved_opened_and_registered_as_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, queries) = data(dir.path());
    let ctx = session_with_queries(&queries).await;
    let index = index_of(&ctx, &corpus, &["cosine", "jensenshannon"], "device=cpu").await;
    assert_eq!(index.rows(), 400);
    let expected = collect(&ctx, &knn_sql(corpus.to_str().unwrap(), "cosine", 5, "")).await;

    // Through a DataFrame.
    let left = ctx.table("l").await.unwrap();
    let mut frame = index.knn(left, 5, "").unwrap().collect().await.unwrap();
    frame.retain(|b| b.num_rows() > 0);
    let mut got = answer(&frame);
    got.sort_by_key(|p| (p.0, p.3));
    assert_eq!(answer(&expected), got);

    // Directly: left rows and right rows by position.
    let left_rows = counts(30, 12);
    let left = common::batch(&left_rows);
    let pairs = index
        .probe(&left, Selection::Nearest(5), ProbeOptions::default())
        .unwrap();
    assert_eq!(direct(&pairs, 10_000), without_rank(&expected));

    // As a table: the join probes the value's index (held, not built).
    ctx.register_table("corpus", index.table()).unwrap();
    let sql =
        "SELECT * FROM knn_join(l, corpus, 'cosine', 5, 'device=cpu') ORDER BY query_id, rank";
    assert_eq!(answer(&expected), answer(&collect(&ctx, sql).await));
    let counters = explain_counters(&ctx, sql, &["index_built", "index_loaded"]).await;
    assert_eq!(counters, vec![0, 0]);
    let count = collect(&ctx, "SELECT count(*) AS n FROM corpus").await;
    let count = arrow::util::pretty::pretty_format_batches(&count)
        .unwrap()
        .to_string();
    assert!(count.contains("| 400 |"), "{count}");

    // A metric the value was not built for: an error listing those it serves.
    let err = ctx
        .sql("SELECT * FROM knn_join(l, corpus, 'manhattan', 5, 'device=cpu')")
        .await
        .unwrap()
        .collect()
        .await
        .expect_err("manhattan is not served");
    let message = err.to_string();
    assert!(
        message.contains("cosine") && message.contains("jensenshannon"),
        "{message}"
    );

    // Saved and opened again: the same bits, for both metrics.
    let file = dir.path().join("both.skidx");
    index.save(&file).unwrap();
    let opened = SparseIndex::open(&file).unwrap();
    assert_eq!(opened.rows(), 400);
    for metric in index.metrics() {
        let a = index
            .probe_metric(
                metric,
                &left,
                Selection::Nearest(6),
                ProbeOptions::default(),
            )
            .unwrap();
        let b = opened
            .probe_metric(
                metric,
                &left,
                Selection::Nearest(6),
                ProbeOptions::default(),
            )
            .unwrap();
        assert_eq!(a, b, "{}", metric.name());
    }
}

fn cli() -> Command {
    Command::new(crate::common::sparse_knn_bin())
}

fn run_ok(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn run_err(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert!(!out.status.success(), "{command:?} succeeded");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn the_cli_writes_an_index_that_sql_and_knn_load_and_never_overwrites_by_surprise() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, queries) = data(dir.path());
    let file = dir.path().join("corpus.skidx");
    let index = |extra: &[&str]| {
        let mut c = cli();
        c.args(["index", "--input", corpus.to_str().unwrap(), "--output"])
            .arg(&file)
            .args([
                "--metric",
                "cosine",
                "--metric",
                "minkowski",
                "--options",
                "p=2.5",
            ])
            .args(extra);
        c
    };
    run_ok(&mut index(&[]));
    let written = std::fs::read(&file).unwrap();
    let err = run_err(&mut index(&[]));
    assert!(err.contains("--overwrite"), "{err}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        written,
        "the file was touched"
    );

    let sql = |right: &Path, metric: &str, options: &str| {
        run_ok(cli().args([
            "sql",
            "--format",
            "csv",
            "--table",
            &format!("l={}", queries.display()),
            "-c",
            &format!(
                "SELECT query_id, neighbor_id, distance, rank FROM knn_join(l, '{}', '{metric}', 4, \
                 'device=cpu{options}') ORDER BY query_id, rank",
                right.display()
            ),
        ]))
    };
    for (metric, options) in [("cosine", ""), ("minkowski", ", p=2.5")] {
        let fresh = sql(&corpus, metric, options);
        assert!(fresh.lines().count() > 100, "{fresh}");
        assert_eq!(fresh, sql(&file, metric, options), "{metric}");
    }
    // minkowski with another p is another index: not in the file.
    let err = run_err(cli().args([
        "sql",
        "--table",
        &format!("l={}", queries.display()),
        "-c",
        &format!(
            "SELECT * FROM knn_join(l, '{}', 'minkowski', 4, 'device=cpu, p=3')",
            file.display()
        ),
    ]));
    assert!(
        err.contains(&file.display().to_string())
            && err.contains("p=2.5")
            && err.contains("cosine"),
        "{err}"
    );

    // `knn --right FILE.skidx` writes what it writes from the Parquet source.
    let out_a = dir.path().join("a.parquet");
    let out_b = dir.path().join("b.parquet");
    for (right, out) in [(&corpus, &out_a), (&file, &out_b)] {
        run_ok(
            cli()
                .args(["knn", "--left"])
                .arg(&queries)
                .arg("--right")
                .arg(right)
                .args([
                    "--metric", "cosine", "-k", "3", "--device", "cpu", "--output",
                ])
                .arg(out),
        );
    }
    let read = |p: &Path| {
        let file = std::fs::File::open(p).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
        let mut pairs = answer(&batches);
        pairs.sort();
        pairs
    };
    assert_eq!(read(&out_a), read(&out_b));
}

/// Section offsets of an index file, read from its trailer and header.
fn sections(bytes: &[u8]) -> (usize, usize, usize) {
    let n = bytes.len();
    let header_at = u64::from_le_bytes(bytes[n - 32..n - 24].try_into().unwrap()) as usize;
    let header_len = u64::from_le_bytes(bytes[n - 24..n - 16].try_into().unwrap()) as usize;
    let header: serde_json::Value =
        serde_json::from_slice(&bytes[header_at..header_at + header_len]).unwrap();
    let data = header["data"]["offset"].as_u64().unwrap() as usize;
    let index = header["indexes"][0]["shards"][0]["section"]["offset"]
        .as_u64()
        .unwrap() as usize;
    (data, index, header_at)
}

#[tokio::test]
async fn damaged_cut_and_foreign_index_files_are_errors_that_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, queries) = data(dir.path());
    let ctx = session_with_queries(&queries).await;
    let good = dir.path().join("good.skidx");
    index_of(&ctx, &corpus, &["cosine"], "device=cpu")
        .await
        .save(&good)
        .unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let (data, index, header) = sections(&bytes);
    let flipped = |at: usize| {
        let mut b = bytes.clone();
        b[at] ^= 0x5a;
        b
    };
    let mut wrong_version = bytes.clone();
    wrong_version[8] = 9;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", Vec::new(), "not a sparse-knn index file"),
        (
            "parquet",
            std::fs::read(&corpus).unwrap(),
            "not a sparse-knn index file",
        ),
        ("version", wrong_version, "format version 9"),
        ("cut_start", bytes[..40].to_vec(), "damaged or cut short"),
        (
            "cut_half",
            bytes[..bytes.len() / 2].to_vec(),
            "damaged or cut short",
        ),
        (
            "cut_end",
            bytes[..bytes.len() - 1].to_vec(),
            "damaged or cut short",
        ),
        ("rows", flipped(data + 200), "damaged or cut short"),
        ("index", flipped(index + 100), "damaged or cut short"),
        ("header", flipped(header + 5), "damaged or cut short"),
    ];
    for (name, contents, expected) in cases {
        let path = dir.path().join(format!("{name}.skidx"));
        std::fs::write(&path, contents).unwrap();
        let sql = knn_sql(path.to_str().unwrap(), "cosine", 3, "");
        let result = match ctx.sql(&sql).await {
            Ok(frame) => frame.collect().await.map(|_| ()),
            Err(e) => Err(e),
        };
        let message = result.expect_err(name).to_string();
        assert!(
            message.contains(path.to_str().unwrap()) && message.contains(expected),
            "{name}: {message}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// On the GPU.

fn gpu_knn_sql(right: &str, metric: &str, options: &str) -> String {
    format!(
        "SELECT * FROM knn_join(l, '{right}', '{metric}', 9, 'device=gpu, {options}') \
         ORDER BY query_id, rank"
    )
}

async fn gpu_session(queries: &str) -> SessionContext {
    let ctx = datafusion_sparse_knn::session_context();
    ctx.register_parquet("l", queries, Default::default())
        .await
        .unwrap();
    ctx
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a CUDA GPU"]
async fn reused_loaded_and_held_gpu_indexes_answer_like_a_fresh_build_for_every_metric() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.parquet");
    let queries = dir.path().join("queries.parquet");
    write_parquet(&corpus, &counts(3000, 21), 0);
    write_parquet(&queries, &counts(200, 22), 100_000);
    let (corpus, queries) = (corpus.to_str().unwrap(), queries.to_str().unwrap());
    let ctx = gpu_session(queries).await;
    for kind in MetricKind::all() {
        let name = kind.name();
        let options = options_for(kind);
        let sql = gpu_knn_sql(corpus, name, options);
        // Fresh: a session of its own, nothing cached.
        let fresh_ctx = gpu_session(queries).await;
        let fresh = collect(&fresh_ctx, &sql).await;
        assert!(!fresh.is_empty(), "{name}");
        // Built once in `ctx`, then reused from its cache.
        let first = collect(&ctx, &sql).await;
        let reused = explain_counters(&ctx, &sql, &["index_built", "index_reused"]).await;
        assert_eq!(reused, vec![0, 1], "{name}: the second statement reuses");
        let again = collect(&ctx, &sql).await;
        assert_eq!(answer(&fresh), answer(&first), "{name}: first");
        assert_eq!(answer(&fresh), answer(&again), "{name}: reused");

        // From an index file's rows: the GPU index is built from them, with the same bits.
        let file = dir.path().join(format!("{name}.skidx"));
        let frame = ctx.read_parquet(corpus, Default::default()).await.unwrap();
        let value = SparseIndex::build(frame, &[name], &format!("device=gpu, {options}"))
            .await
            .unwrap();
        value.save(&file).unwrap();
        let from_file = collect(
            &fresh_ctx,
            &gpu_knn_sql(file.to_str().unwrap(), name, options),
        )
        .await;
        assert_eq!(
            answer(&fresh),
            answer(&from_file),
            "{name}: from the file's rows"
        );

        // Held by the value on the GPU: probed twice, the same pairs as the SQL join.
        let left = common::batch(&counts(200, 22));
        for _ in 0..2 {
            let pairs = value
                .probe(&left, Selection::Nearest(9), ProbeOptions::default())
                .unwrap();
            assert_eq!(
                direct(&pairs, 100_000),
                without_rank(&fresh),
                "{name}: held by the value"
            );
        }
    }
}
