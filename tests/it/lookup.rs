//! A lookup by key (SPEC "Filtered right sides"): a left side that filters the right side's own
//! source (`knn_join((SELECT * FROM docs WHERE id = 42), docs, ...)`) takes its rows from the
//! kept side, not from a new scan of the source (EXPLAIN ANALYZE: `left_rows_from_index`), and
//! answers exactly as the same rows given as a table of their own, for every metric; a left
//! predicate the kept side cannot evaluate reads the left input as before; a rewritten source
//! is read again.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use datafusion_sparse_knn::metric::MetricKind;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use crate::common::{self, batch_of, collect, counts, explain_counters};

/// `rows` raw-count rows as `docs`: id, lang ('en', 'de' or NULL by id) and v, in row groups of
/// 128 rows.
fn write_docs(path: &Path, rows: usize, seed: u64) {
    let batch = batch_of(&counts(rows, seed), 0);
    let langs: ArrayRef = Arc::new(StringArray::from_iter((0..rows).map(|i| match i % 3 {
        0 => Some("en"),
        1 => Some("de"),
        _ => None,
    })));
    let schema = Arc::new(Schema::new(vec![
        batch.schema().field(0).clone(),
        Field::new("lang", DataType::Utf8, true),
        batch.schema().field(1).clone(),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::clone(batch.column(0)),
            langs,
            Arc::clone(batch.column(1)),
        ],
    )
    .unwrap();
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(128))
        .build();
    let mut writer =
        ArrowWriter::try_new(File::create(path).unwrap(), schema, Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

/// A session over `docs` whose scans give batches of 50 rows: the kept side's vectors are held
/// in many arrays, and a lookup's rows come from several.
async fn session(docs: &Path) -> SessionContext {
    let ctx = datafusion_sparse_knn::session_context();
    collect(&ctx, "SET datafusion.execution.batch_size = 50").await;
    ctx.register_parquet("docs", docs.to_str().unwrap(), Default::default())
        .await
        .unwrap();
    ctx
}

/// The rows of `docs` that pass `predicate`, as an in-memory table `q`: the left side given as a
/// table of its own.
async fn copy_of_rows(ctx: &SessionContext, predicate: &str) {
    let rows = collect(ctx, &format!("SELECT * FROM docs WHERE {predicate}")).await;
    let schema = ctx.table("docs").await.unwrap().schema().inner().clone();
    ctx.deregister_table("q").unwrap();
    ctx.register_table(
        "q",
        Arc::new(MemTable::try_new(schema, vec![rows]).unwrap()),
    )
    .unwrap();
}

fn options_for(kind: MetricKind) -> &'static str {
    match kind {
        MetricKind::Minkowski => "p=3",
        k if k.needs_dim() => "dim=60",
        _ => "",
    }
}

fn text(batches: &[RecordBatch]) -> String {
    arrow::util::pretty::pretty_format_batches(batches)
        .unwrap()
        .to_string()
}

const LOOKUPS: [&str; 5] = [
    "id = 42",
    "id % 37 = 5",
    "lang = 'de' AND id < 90",
    "lang IS NULL",
    "id < 0",
];

#[tokio::test]
async fn a_lookup_by_key_answers_as_its_rows_given_alone_for_every_metric() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs.parquet");
    write_docs(&docs, 600, 41);
    let ctx = session(&docs).await;
    for kind in MetricKind::all() {
        let (metric, options) = (kind.name(), options_for(kind));
        for predicate in LOOKUPS {
            copy_of_rows(&ctx, predicate).await;
            let by_key = format!(
                "SELECT * FROM knn_join((SELECT * FROM docs WHERE {predicate}), docs, '{metric}', \
                 7, 'device=cpu, {options}') ORDER BY query_id, rank"
            );
            let alone = format!(
                "SELECT * FROM knn_join(q, docs, '{metric}', 7, 'device=cpu, {options}') \
                 ORDER BY query_id, rank"
            );
            let (got, want) = (collect(&ctx, &by_key).await, collect(&ctx, &alone).await);
            let what = format!("{metric}, {predicate}");
            common::assert_same_pairs(&common::pairs(&got), &common::pairs(&want), &what);
            // The left rows' other columns come from the kept side too.
            let shown = "SELECT query_id, query_lang, neighbor_id, neighbor_lang, rank FROM";
            let shown_of = |sql: &str| sql.replacen("SELECT * FROM", shown, 1);
            assert_eq!(
                text(&collect(&ctx, &shown_of(&by_key)).await),
                text(&collect(&ctx, &shown_of(&alone)).await),
                "{what}"
            );
        }
    }
}

#[tokio::test]
async fn a_lookup_by_key_reads_no_source_and_reuses_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs.parquet");
    write_docs(&docs, 500, 43);
    let ctx = session(&docs).await;
    let names = ["index_built", "index_reused", "left_rows_from_index"];
    let lookup = |predicate: &str| {
        format!(
            "SELECT * FROM knn_join((SELECT * FROM docs WHERE {predicate}), docs, 'cosine', 5, \
             'device=cpu')"
        )
    };
    assert_eq!(
        explain_counters(&ctx, &lookup("id = 42"), &names).await,
        vec![1, 0, 1]
    );
    for (predicate, rows) in [("id = 7", 1), ("id % 10 = 3", 50), ("id < 0", 0)] {
        assert_eq!(
            explain_counters(&ctx, &lookup(predicate), &names).await,
            vec![0, 1, rows],
            "{predicate}"
        );
    }
    // Only some columns shown: the right side still keeps the key, so the lookup still takes
    // its rows from the kept side.
    let narrow = "SELECT neighbor_id, distance FROM knn_join((SELECT * FROM docs WHERE id = 9), \
                  docs, 'cosine', 5, 'device=cpu')";
    assert_eq!(explain_counters(&ctx, narrow, &names[2..]).await, vec![1]);
    // A filtered right side too: the left rows from the kept side, the right rows masked.
    let both = "SELECT * FROM knn_join((SELECT * FROM docs WHERE id = 42), (SELECT * FROM docs \
                WHERE lang = 'en'), 'cosine', 5, 'device=cpu')";
    assert_eq!(
        explain_counters(
            &ctx,
            both,
            &["index_reused", "rows_passed", "left_rows_from_index"]
        )
        .await,
        vec![1, 167, 1]
    );
    let plan = text(&collect(&ctx, &format!("EXPLAIN {}", lookup("id = 42"))).await);
    assert!(plan.contains("left_filter=kept"), "{plan}");
    // A predicate on the vectors: the left input is read, as before.
    let on_vectors = lookup("id = 42 AND v IS NOT NULL");
    assert_eq!(
        explain_counters(&ctx, &on_vectors, &names[2..]).await,
        vec![0]
    );
    let with_key = collect(&ctx, &format!("{} ORDER BY rank", lookup("id = 42"))).await;
    let with_vectors = collect(&ctx, &format!("{on_vectors} ORDER BY rank")).await;
    assert_eq!(text(&with_key), text(&with_vectors));
}

#[tokio::test]
async fn a_rewritten_source_gives_its_new_rows_to_the_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs.parquet");
    write_docs(&docs, 300, 45);
    let ctx = session(&docs).await;
    let lookup = "SELECT * FROM knn_join((SELECT * FROM docs WHERE id % 50 = 1), docs, \
                  'manhattan', 4, 'device=cpu') ORDER BY query_id, rank";
    let before = collect(&ctx, lookup).await;
    // Other vectors under the same ids (a file's modification time has a second's grain on
    // some file systems).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    write_docs(&docs, 300, 46);
    let after = collect(&ctx, lookup).await;
    let fresh = collect(&session(&docs).await, lookup).await;
    assert_eq!(text(&after), text(&fresh));
    assert_ne!(text(&after), text(&before));
}

#[tokio::test]
#[ignore = "needs a CUDA GPU"]
async fn a_lookup_by_key_on_the_gpu_answers_as_its_rows_alone_and_as_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs.parquet");
    write_docs(&docs, 2000, 47);
    let ctx = session(&docs).await;
    for metric in ["cosine", "manhattan", "jensenshannon", "jaccard"] {
        for predicate in LOOKUPS {
            copy_of_rows(&ctx, predicate).await;
            let sql = |left: &str, device: &str| {
                format!(
                    "SELECT * FROM knn_join({left}, docs, '{metric}', 7, 'device={device}') \
                     ORDER BY query_id, rank"
                )
            };
            let by_key = format!("(SELECT * FROM docs WHERE {predicate})");
            let gpu = collect(&ctx, &sql(&by_key, "gpu")).await;
            let what = format!("{metric}, {predicate}");
            assert_eq!(
                text(&gpu),
                text(&collect(&ctx, &sql("q", "gpu")).await),
                "{what}: by key against the rows alone"
            );
            let (gpu, cpu) = (
                common::pairs(&gpu),
                common::pairs(&collect(&ctx, &sql(&by_key, "cpu")).await),
            );
            assert_eq!(gpu.len(), cpu.len(), "{what}");
            for (g, c) in gpu.iter().zip(&cpu) {
                assert_eq!((g.0, g.3), (c.0, c.3), "{what}");
                assert!(
                    (g.2 - c.2).abs() <= 1e-6 * c.2.abs().max(1.0),
                    "{what}: {g:?} against the CPU's {c:?}"
                );
            }
        }
        let counters = explain_counters(
            &ctx,
            &format!(
                "SELECT * FROM knn_join((SELECT * FROM docs WHERE id = 3), docs, '{metric}', 7, \
                 'device=gpu')"
            ),
            &["index_reused", "left_rows_from_index"],
        )
        .await;
        assert_eq!(counters, vec![1, 1], "{metric}");
    }
}

/// A session over `docs` whose memory pool holds `limit` bytes.
async fn bounded_session(docs: &Path, limit: usize) -> SessionContext {
    let config = datafusion::prelude::SessionConfig::new()
        .with_option_extension(datafusion_sparse_knn::options::SparseKnnConfig::default())
        .with_batch_size(50);
    let runtime = datafusion_sparse_knn::runtime_env_builder()
        .with_memory_limit(limit, 1.0)
        .build_arc()
        .unwrap();
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    datafusion_sparse_knn::register_all(&ctx).unwrap();
    ctx.register_parquet("docs", docs.to_str().unwrap(), Default::default())
        .await
        .unwrap();
    ctx
}

#[tokio::test]
async fn a_pool_without_room_for_the_vectors_reads_the_left_side_and_answers_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs.parquet");
    write_docs(&docs, 600, 49);
    let lookup = "SELECT * FROM knn_join((SELECT * FROM docs WHERE id % 37 = 5), docs, 'cosine', \
                  5, 'device=cpu')";
    let unbounded = session(&docs).await;
    // (no ORDER BY: a sort would need more of the pool than the join)
    let sorted = |batches: Vec<RecordBatch>| {
        let mut pairs = common::pairs(&batches);
        pairs.sort_by_key(|p| (p.0, p.3));
        pairs
    };
    let want = sorted(collect(&unbounded, lookup).await);
    // The bytes of the side as read, about what its vectors keep: the smallest pool (in tenths
    // of that) in which the lookup runs holds the index, not the vectors beside it.
    let read: usize = collect(&unbounded, "SELECT * FROM docs")
        .await
        .iter()
        .map(RecordBatch::get_array_memory_size)
        .sum();
    let mut tenths = 10;
    let ctx = loop {
        assert!(tenths <= 100, "no pool up to 10x the read ran the lookup");
        let ctx = bounded_session(&docs, read * tenths / 10).await;
        match ctx.sql(lookup).await.unwrap().collect().await {
            Ok(_) => break ctx,
            Err(e) if tenths == 100 => panic!("{e}"),
            Err(_) => {}
        }
        tenths += 1;
    };
    assert_eq!(sorted(collect(&ctx, lookup).await), want);
    // (a side that is not a quarter of the pool is not cached: each statement builds it)
    let counters = explain_counters(&ctx, lookup, &["left_rows_from_index"]).await;
    assert_eq!(
        counters,
        vec![0],
        "the side holds no vectors: the left side is read"
    );
    // With room for them, the same lookup takes its rows from the side.
    let roomy = bounded_session(&docs, read * (tenths + 20) / 10).await;
    assert_eq!(sorted(collect(&roomy, lookup).await), want);
    let counters = explain_counters(&roomy, lookup, &["left_rows_from_index"]).await;
    assert_eq!(counters, vec![17], "ids 5, 42, ..., 597");
}
