//! The index cache (SPEC, "Indexes that outlive a statement"): a right side built by one
//! statement is reused by later ones over the same data, and answers bit for bit as a fresh
//! build does; every change of the data or of the options that shape the index is a rebuild; a
//! small cache evicts and stays within its bound; `index_cache = 0` builds every time.
//!
//! EXPLAIN ANALYZE's `index_built` / `index_reused` counters say which happened.

use crate::common;

use std::sync::Arc;

use arrow::array::RecordBatch;

use crate::common::{batch_of, collect, counts, explain_counters, write_parquet, Row};

/// (query id, neighbor id, distance bits, rank) in output order: reuse must give the same bits.
fn answer(batches: &[RecordBatch]) -> Vec<(i64, i64, u64, i32)> {
    common::pairs(batches)
        .into_iter()
        .map(|(q, n, d, r)| (q, n, d.to_bits(), r))
        .collect()
}
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sparse_knn::index::IndexCache;
use datafusion_sparse_knn::metric::MetricKind;

/// A session like `register_all`'s, with the cache bound `index_cache` (None: the default).
fn session(index_cache: Option<&str>) -> SessionContext {
    let ctx = datafusion_sparse_knn::session_context();
    if let Some(bound) = index_cache {
        let state = ctx.state_ref();
        let mut state = state.write();
        state
            .config_mut()
            .options_mut()
            .set("sparse_knn.index_cache", bound)
            .unwrap();
    }
    ctx
}

/// Registers `path` as table `l`, the left side of the tests' joins.
async fn left_table(ctx: &SessionContext, path: &str) {
    ctx.deregister_table("l").unwrap();
    ctx.register_parquet("l", path, Default::default())
        .await
        .unwrap();
}

/// The join's `index_built` and `index_reused` counters from EXPLAIN ANALYZE of `sql`.
async fn built_and_reused(ctx: &SessionContext, sql: &str) -> (usize, usize) {
    let c = explain_counters(ctx, sql, &["index_built", "index_reused"]).await;
    (c[0], c[1])
}

fn options_for(kind: MetricKind) -> &'static str {
    match kind {
        MetricKind::Minkowski => "p=3",
        k if k.needs_dim() => "dim=60",
        _ => "",
    }
}

#[tokio::test]
async fn a_reused_index_answers_bit_for_bit_like_a_fresh_build_for_every_metric() {
    let dir = tempfile::tempdir().unwrap();
    let right = dir.path().join("right.parquet");
    write_parquet(&right, &counts(300, 1), 0);
    let right = right.to_str().unwrap();
    let cached = session(None);
    let fresh = session(Some("0"));
    left_table(&cached, right).await;
    left_table(&fresh, right).await;
    for kind in MetricKind::all() {
        let metric = kind.name();
        let options = options_for(kind);
        let sql = format!(
            "SELECT * FROM knn_join((SELECT * FROM l WHERE id % 7 = 0), '{right}', \
             '{metric}', 5, 'device=cpu, {options}') ORDER BY query_id, rank"
        );
        // First statement builds, the next ones reuse.
        assert_eq!(built_and_reused(&cached, &sql).await, (1, 0), "{metric}");
        assert_eq!(built_and_reused(&cached, &sql).await, (0, 1), "{metric}");
        let reused = answer(&collect(&cached, &sql).await);
        assert_eq!(built_and_reused(&fresh, &sql).await, (1, 0), "{metric}");
        assert_eq!(
            built_and_reused(&fresh, &sql).await,
            (1, 0),
            "{metric}: cache off"
        );
        let built = answer(&collect(&fresh, &sql).await);
        assert!(reused.len() > 100, "{metric}: {} pairs", reused.len());
        assert_eq!(reused, built, "{metric}");
    }
}

#[tokio::test]
async fn one_index_serves_knn_and_radius_joins_of_any_k_and_left_side() {
    let dir = tempfile::tempdir().unwrap();
    let right = dir.path().join("right.parquet");
    write_parquet(&right, &counts(200, 2), 0);
    let right = right.to_str().unwrap();
    let ctx = session(None);
    left_table(&ctx, right).await;
    let knn = |k: usize, filter: &str| {
        format!(
            "SELECT * FROM knn_join((SELECT * FROM l WHERE {filter}), '{right}', \
             'cosine', {k}, 'device=cpu')"
        )
    };
    assert_eq!(built_and_reused(&ctx, &knn(3, "id < 10")).await, (1, 0));
    assert_eq!(built_and_reused(&ctx, &knn(7, "id > 150")).await, (0, 1));
    let radius = format!(
        "SELECT * FROM radius_join((SELECT * FROM l WHERE id = 4), '{right}', 'cosine', \
         0.5, 'device=cpu')"
    );
    assert_eq!(built_and_reused(&ctx, &radius).await, (0, 1));
}

#[tokio::test]
async fn a_file_rewritten_in_place_is_a_rebuild_with_the_new_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("right.parquet");
    write_parquet(&path, &counts(150, 3), 0);
    let right = path.to_str().unwrap();
    let ctx = session(None);
    left_table(&ctx, right).await;
    let sql = format!(
        "SELECT * FROM knn_join((SELECT * FROM l WHERE id < 5), '{right}', 'manhattan', \
         3, 'device=cpu') ORDER BY query_id, rank"
    );
    assert_eq!(built_and_reused(&ctx, &sql).await, (1, 0));
    let before = answer(&collect(&ctx, &sql).await);
    // Same path, same row count, other values: only the file's size, time or content differ.
    write_parquet(&path, &counts(150, 4), 0);
    assert_eq!(built_and_reused(&ctx, &sql).await, (1, 0));
    let after = answer(&collect(&ctx, &sql).await);
    assert_ne!(before, after);
    let fresh_session = session(Some("0"));
    left_table(&fresh_session, right).await;
    let fresh = answer(&collect(&fresh_session, &sql).await);
    assert_eq!(after, fresh);
}

/// A folder's files as the scan sees them: with DataFusion's listing cache off, a file added is
/// seen at once and the index is rebuilt with its rows; with it on (the default), the scan sees
/// the folder as it was listed, and the cached index answers exactly as an uncached join does.
#[tokio::test]
async fn a_file_added_to_a_folder_is_a_rebuild_that_sees_it() {
    for listing_cache in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("corpus");
        std::fs::create_dir(&folder).unwrap();
        let first = folder.join("a.parquet");
        write_parquet(&first, &counts(100, 5), 0);
        let ctx = session(None);
        if !listing_cache {
            collect(&ctx, "SET datafusion.runtime.list_files_cache_limit = '0'").await;
        }
        left_table(&ctx, first.to_str().unwrap()).await;
        let sql = format!(
            "SELECT * FROM knn_join((SELECT * FROM l WHERE id < 3), '{}/', 'cosine', 500, \
             'device=cpu') ORDER BY query_id, rank",
            folder.display()
        );
        let uncached = sql.replace("device=cpu", "device=cpu, index_cache=0");
        assert_eq!(built_and_reused(&ctx, &sql).await, (1, 0));
        assert_eq!(built_and_reused(&ctx, &sql).await, (0, 1));
        let right_rows = |batches: &[RecordBatch]| -> usize {
            let mut ids: Vec<i64> = answer(batches).iter().map(|p| p.1).collect();
            ids.sort_unstable();
            ids.dedup();
            ids.len()
        };
        let before = right_rows(&collect(&ctx, &sql).await);
        write_parquet(&folder.join("b.parquet"), &counts(100, 6), 1000);
        let want = answer(&collect(&ctx, &uncached).await);
        let got = collect(&ctx, &sql).await;
        assert_eq!(answer(&got), want, "listing cache {listing_cache}");
        if !listing_cache {
            let after = right_rows(&got);
            assert!(after > before + 50, "{before} -> {after} right rows seen");
            assert_eq!(built_and_reused(&ctx, &sql).await, (0, 1));
        }
    }
}

#[tokio::test]
async fn a_replaced_or_appended_in_memory_table_is_a_rebuild() {
    let ctx = session(None);
    let register = |rows: &[Row], first_id: i64| {
        let batch = batch_of(rows, first_id);
        let table =
            datafusion::datasource::MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap();
        ctx.deregister_table("r").unwrap();
        ctx.register_table("r", Arc::new(table)).unwrap();
    };
    register(&counts(120, 7), 0);
    let sql = "SELECT * FROM knn_join((SELECT * FROM r WHERE id < 4), r, 'euclidean', 3, \
               'device=cpu') ORDER BY query_id, rank";
    assert_eq!(built_and_reused(&ctx, sql).await, (1, 0));
    assert_eq!(built_and_reused(&ctx, sql).await, (0, 1));
    register(&counts(120, 8), 0);
    assert_eq!(built_and_reused(&ctx, sql).await, (1, 0));
    assert_eq!(built_and_reused(&ctx, sql).await, (0, 1));
    // Rows appended by INSERT: a new version of the same table.
    ctx.sql("INSERT INTO r SELECT id + 1000, v FROM r WHERE id < 50")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(built_and_reused(&ctx, sql).await, (1, 0));
}

#[tokio::test]
async fn options_that_shape_the_index_are_a_rebuild_and_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let right = dir.path().join("right.parquet");
    write_parquet(&right, &counts(100, 9), 0);
    let right = right.to_str().unwrap();
    let ctx = session(None);
    left_table(&ctx, right).await;
    let sql = |metric: &str, options: &str| {
        format!(
            "SELECT * FROM knn_join((SELECT * FROM l WHERE id < 3), '{right}', \
             '{metric}', 3, 'device=cpu{options}')"
        )
    };
    assert_eq!(
        built_and_reused(&ctx, &sql("minkowski", ", p=3")).await,
        (1, 0)
    );
    assert_eq!(
        built_and_reused(&ctx, &sql("minkowski", ", p=3")).await,
        (0, 1)
    );
    assert_eq!(
        built_and_reused(&ctx, &sql("minkowski", ", p=4")).await,
        (1, 0)
    );
    assert_eq!(built_and_reused(&ctx, &sql("manhattan", "")).await, (1, 0));
    assert_eq!(
        built_and_reused(&ctx, &sql("manhattan", ", exclude_self=id")).await,
        (1, 0)
    );
    assert_eq!(
        built_and_reused(&ctx, &sql("manhattan", ", exclude_self=id")).await,
        (0, 1)
    );
    // The left side's vector column is not the index's business.
    assert_eq!(
        built_and_reused(&ctx, &sql("manhattan", ", left_column=v")).await,
        (0, 1)
    );
}

#[tokio::test]
async fn a_small_cache_evicts_the_least_recently_used_and_stays_within_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for i in 0..3 {
        let path = dir.path().join(format!("r{i}.parquet"));
        write_parquet(&path, &counts(400, 20 + i), 0);
        paths.push(path.to_str().unwrap().to_string());
    }
    let sql = |p: &str| {
        format!(
            "SELECT * FROM knn_join((SELECT * FROM l WHERE id < 3), '{p}', 'cosine', 3, \
             'device=cpu')"
        )
    };
    // Measure one side, then bound the cache to hold two of the three.
    let probe = session(None);
    left_table(&probe, &paths[0]).await;
    built_and_reused(&probe, &sql(&paths[0])).await;
    let one = cache_of(&probe).bytes();
    assert!(one > 0);
    let bound = one * 5 / 2;
    let ctx = session(Some(&bound.to_string()));
    left_table(&ctx, &paths[0]).await;
    let cache = cache_of(&ctx);
    for p in &paths[..2] {
        assert_eq!(built_and_reused(&ctx, &sql(p)).await, (1, 0));
    }
    assert_eq!(cache.len(), 2);
    // r0 used again, so r1 is now the least recently used: r2 evicts it.
    assert_eq!(built_and_reused(&ctx, &sql(&paths[0])).await, (0, 1));
    assert_eq!(built_and_reused(&ctx, &sql(&paths[2])).await, (1, 0));
    assert_eq!(cache.len(), 2);
    assert!(cache.bytes() <= bound, "{} > {bound}", cache.bytes());
    assert_eq!(built_and_reused(&ctx, &sql(&paths[0])).await, (0, 1));
    assert_eq!(built_and_reused(&ctx, &sql(&paths[1])).await, (1, 0));
    // A side larger than the whole bound is not kept.
    let tiny = session(Some("1KiB"));
    left_table(&tiny, &paths[0]).await;
    assert_eq!(built_and_reused(&tiny, &sql(&paths[0])).await, (1, 0));
    assert_eq!(built_and_reused(&tiny, &sql(&paths[0])).await, (1, 0));
    assert!(cache_of(&tiny).is_empty());
}

#[tokio::test]
async fn the_cache_counts_in_the_memory_pool_and_setting_zero_empties_it() {
    let dir = tempfile::tempdir().unwrap();
    let right = dir.path().join("right.parquet");
    write_parquet(&right, &counts(400, 30), 0);
    let right = right.to_str().unwrap();
    let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
        .with_memory_limit(256 << 20, 1.0)
        .build_arc()
        .unwrap();
    let config = SessionConfig::new()
        .with_option_extension(datafusion_sparse_knn::options::SparseKnnConfig::default());
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    datafusion_sparse_knn::register_all(&ctx).unwrap();
    left_table(&ctx, right).await;
    let sql = format!(
        "SELECT * FROM knn_join((SELECT * FROM l WHERE id < 3), '{right}', 'cosine', 3, \
         'device=cpu')"
    );
    assert_eq!(built_and_reused(&ctx, &sql).await, (1, 0));
    let held = cache_of(&ctx).bytes();
    let reserved = ctx.runtime_env().memory_pool.reserved();
    assert!(
        held > 0 && reserved >= held / 2,
        "cache {held}, pool {reserved}"
    );
    ctx.sql("SET sparse_knn.index_cache = '0'").await.unwrap();
    assert_eq!(built_and_reused(&ctx, &sql).await, (1, 0));
    assert!(cache_of(&ctx).is_empty());
    assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0);
}

#[tokio::test]
async fn a_bad_cache_setting_is_an_error_that_names_it() {
    let ctx = session(None);
    let e = ctx
        .sql("SET sparse_knn.index_cache = 'lots'")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("index_cache"), "{e}");
}

fn cache_of(ctx: &SessionContext) -> Arc<IndexCache> {
    ctx.state()
        .config()
        .get_extension::<IndexCache>()
        .expect("register_all installs an index cache")
}

/// A cluster executor keeps the right sides it builds for all its tasks and later queries: a
/// left side of eight files is several tasks, started together, and the right side is built once.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_builds_a_right_side_once_for_all_its_tasks_and_queries() {
    let _cluster = common::IN_PROCESS_CLUSTER.lock().await;
    use datafusion_sparse_knn::cluster::{executor_index_cache, standalone_context};
    let dir = tempfile::tempdir().unwrap();
    let left = dir.path().join("left");
    std::fs::create_dir(&left).unwrap();
    let rows = counts(400, 40);
    for part in 0..8 {
        let first = part * 50;
        write_parquet(
            &left.join(format!("part{part}.parquet")),
            &rows[first..first + 50],
            first as i64,
        );
    }
    let right = dir.path().join("right.parquet");
    write_parquet(&right, &counts(300, 41), 0);
    let sql = format!(
        "SELECT query_id, neighbor_id, distance, rank FROM knn_join('{}/', '{}', 'cosine', 4, \
         'device=cpu') ORDER BY query_id, rank",
        left.display(),
        right.display()
    );
    let local = answer(&collect(&session(Some("0")), &sql).await);
    assert!(local.len() > 1400, "{} pairs", local.len());
    let cache = executor_index_cache();
    let (builds, hits) = (cache.builds(), cache.hits());
    let cluster = standalone_context(4).await.unwrap();
    // One task per file.
    collect(&cluster, "SET datafusion.execution.target_partitions = 8").await;
    for _ in 0..2 {
        let remote = answer(&collect(&cluster, &sql).await);
        assert_eq!(remote, local);
    }
    // Each query runs several tasks (Ballista groups the files into at least three partitions
    // here); before the cache each built the right side, now one build serves them all.
    let (built, reused) = (cache.builds() - builds, cache.hits() - hits);
    assert_eq!(built, 1, "built {built} times, reused {reused} times");
    assert!(reused >= 3, "built {built} times, reused {reused} times");
}

/// A right side whose rows may differ from one statement to the next (a volatile function) is
/// never taken from the cache.
#[tokio::test]
async fn a_right_side_with_a_volatile_function_is_built_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let right = dir.path().join("right.parquet");
    write_parquet(&right, &counts(100, 50), 0);
    let ctx = session(None);
    left_table(&ctx, right.to_str().unwrap()).await;
    let sql = "SELECT * FROM knn_join((SELECT * FROM l WHERE id < 3), \
               (SELECT id, v, random() AS r FROM l), 'cosine', 3, 'device=cpu')";
    assert_eq!(built_and_reused(&ctx, sql).await, (1, 0));
    assert_eq!(built_and_reused(&ctx, sql).await, (1, 0));
    // A volatile filter over the table is a mask evaluated anew by each statement, over the
    // table's own index, which is kept.
    let masked = "SELECT * FROM knn_join((SELECT * FROM l WHERE id < 3), \
                  (SELECT * FROM l WHERE random() < 2.0), 'cosine', 3, 'device=cpu')";
    assert_eq!(built_and_reused(&ctx, masked).await, (1, 0));
    assert_eq!(built_and_reused(&ctx, masked).await, (0, 1));
    let stable = "SELECT * FROM knn_join((SELECT * FROM l WHERE id < 3), \
                  (SELECT id, v, abs(id) AS r FROM l), 'cosine', 3, 'device=cpu')";
    assert_eq!(built_and_reused(&ctx, stable).await, (1, 0));
    assert_eq!(built_and_reused(&ctx, stable).await, (0, 1));
}
