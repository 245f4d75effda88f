//! knn_join / radius_join against a brute force written with `sparse_distance` + ORDER BY over a
//! CROSS JOIN, on small random tables (NULL and empty vectors, several partitions), for every
//! metric; plus the DataFrame API, the UDTF form, exclude_self, memory limits and bad arguments.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sparse_knn::metric::MetricKind;
use datafusion_sparse_knn::options::SparseKnnConfig;
use datafusion_sparse_knn::{planner, SparseBatch};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::pairs;

const DIM: i32 = 40;

/// Random rows: about 1 in 12 NULL, 1 in 12 empty, the rest 1..8 entries out of DIM columns.
fn random_rows(rng: &mut StdRng, n: usize, nonnegative: bool) -> Vec<Option<Vec<(i32, f32)>>> {
    (0..n)
        .map(|_| match rng.random_range(0..12) {
            0 => None,
            1 => Some(vec![]),
            _ => {
                let degree = rng.random_range(1..8);
                let mut cols: Vec<i32> = (0..degree).map(|_| rng.random_range(0..DIM)).collect();
                cols.sort_unstable();
                cols.dedup();
                Some(
                    cols.into_iter()
                        .map(|c| {
                            // Values on a coarse grid, so that exact ties happen.
                            let v = rng.random_range(1..5) as f32 * 0.5;
                            let sign = if !nonnegative && rng.random_bool(0.3) {
                                -1.0
                            } else {
                                1.0
                            };
                            (c, sign * v)
                        })
                        .collect(),
                )
            }
        })
        .collect()
}

/// A table `(id BIGINT, v sparse vector, label TEXT)` split into `partitions` batches; ids start
/// at `first_id` and follow row order.
fn table(rows: &[Option<Vec<(i32, f32)>>], first_id: i64, partitions: usize) -> Arc<MemTable> {
    let vectors = SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", datafusion_sparse_knn::sparse_vector_type(), true),
        Field::new("label", DataType::Utf8, false),
    ]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(
        first_id..first_id + rows.len() as i64,
    ));
    let labels: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows.len()).map(|i| format!("row{}", first_id + i as i64)),
    ));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![ids, Arc::new(vectors.to_array()), labels],
    )
    .unwrap();
    let per = rows.len().div_ceil(partitions);
    let parts = (0..partitions)
        .map(|p| {
            let start = (p * per).min(rows.len());
            let len = per.min(rows.len() - start);
            vec![batch.slice(start, len)]
        })
        .collect();
    Arc::new(MemTable::try_new(schema, parts).unwrap())
}

fn context() -> SessionContext {
    let ctx = datafusion_sparse_knn::session_context();
    let mut rng = StdRng::seed_from_u64(7);
    let left = random_rows(&mut rng, 60, false);
    let right = random_rows(&mut rng, 90, false);
    let left_pos = random_rows(&mut rng, 60, true);
    let right_pos = random_rows(&mut rng, 90, true);
    ctx.register_table("l", table(&left, 0, 3)).unwrap();
    ctx.register_table("r", table(&right, 1000, 2)).unwrap();
    ctx.register_table("lp", table(&left_pos, 0, 3)).unwrap();
    ctx.register_table("rp", table(&right_pos, 1000, 2))
        .unwrap();
    ctx
}

async fn query(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn error(ctx: &SessionContext, sql: &str) -> String {
    match ctx.sql(sql).await {
        Err(e) => e.to_string(),
        Ok(df) => match df.collect().await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{sql}: expected an error"),
        },
    }
}

fn close(a: f64, b: f64) -> bool {
    (a.is_infinite() && b.is_infinite() && a.signum() == b.signum())
        || (a - b).abs() <= 1e-4 * a.abs().max(b.abs()).max(1.0)
}

/// Every pair's distance through `sparse_distance`, in the brute force's nearest-first order.
async fn reference(
    ctx: &SessionContext,
    left: &str,
    right: &str,
    metric: &str,
    options: &str,
) -> BTreeMap<i64, Vec<(i64, f64)>> {
    let similarity = metric.parse::<MetricKind>().unwrap().is_similarity();
    let sql = format!(
        "SELECT q.id AS query_id, n.id AS neighbor_id, sparse_distance(q.v, n.v, '{metric}', '{options}') AS distance \
         FROM {left} q CROSS JOIN {right} n WHERE q.v IS NOT NULL AND n.v IS NOT NULL \
         ORDER BY q.id, distance {}, n.id",
        if similarity { "DESC" } else { "ASC" }
    );
    let mut by_query: BTreeMap<i64, Vec<(i64, f64)>> = BTreeMap::new();
    for (q, n, d, _) in pairs(&query(ctx, &sql).await) {
        by_query.entry(q).or_default().push((n, d));
    }
    by_query
}

/// Checks a knn result against the brute force: per query, the same distances rank by rank and
/// each reported neighbour really at its reported distance (a different neighbour is allowed
/// only within a tie).
fn check_knn(
    metric: &str,
    k: usize,
    got: &[(i64, i64, f64, i32)],
    want: &BTreeMap<i64, Vec<(i64, f64)>>,
    skip_self: bool,
) {
    let mut by_query: BTreeMap<i64, Vec<(i64, f64, i32)>> = BTreeMap::new();
    for &(q, n, d, r) in got {
        by_query.entry(q).or_default().push((n, d, r));
    }
    let mut queries = 0;
    for (q, all) in want {
        let all: Vec<(i64, f64)> = all
            .iter()
            .copied()
            .filter(|(n, _)| !(skip_self && n == q))
            .collect();
        let expect = &all[..k.min(all.len())];
        let mut rows = by_query.remove(q).unwrap_or_default();
        rows.sort_by_key(|r| r.2);
        assert_eq!(
            rows.len(),
            expect.len(),
            "{metric}: query {q}: {rows:?} vs {expect:?}"
        );
        let exact: BTreeMap<i64, f64> = all.iter().copied().collect();
        for (i, ((n, d, rank), (_, wd))) in rows.iter().zip(expect).enumerate() {
            assert_eq!(*rank as usize, i + 1, "{metric}: query {q}: ranks");
            assert!(
                close(*d, *wd),
                "{metric}: query {q} rank {rank}: distance {d} vs brute force {wd}"
            );
            assert!(
                close(*d, exact[n]),
                "{metric}: query {q}: neighbour {n} reported at {d}, is at {}",
                exact[n]
            );
            assert!(
                !(skip_self && n == q),
                "{metric}: exclude_self kept the pair ({q}, {n})"
            );
        }
        queries += 1;
    }
    assert!(
        by_query.is_empty(),
        "{metric}: rows for queries with NULL vectors: {by_query:?}"
    );
    assert!(queries > 40, "too few non-null queries to be a test");
}

/// The metric's parameters, as both `sparse_distance` and the joins take them.
fn options_for(kind: MetricKind) -> &'static str {
    match kind {
        MetricKind::Minkowski => "p=3",
        k if k.needs_dim() => "dim=40",
        _ => "",
    }
}

fn tables_for(kind: MetricKind) -> (&'static str, &'static str) {
    if kind.needs_nonnegative() {
        ("lp", "rp")
    } else {
        ("l", "r")
    }
}

#[tokio::test]
async fn knn_join_equals_brute_force_for_every_metric() {
    let ctx = context();
    for kind in MetricKind::all() {
        let metric = kind.name();
        let options = options_for(kind);
        let (left, right) = tables_for(kind);
        let want = reference(&ctx, left, right, metric, options).await;
        let sql = format!(
            "SELECT * FROM knn_join({left}, {right}, '{metric}', 5, '{options}, device=cpu')"
        );
        check_knn(metric, 5, &pairs(&query(&ctx, &sql).await), &want, false);
    }
}

#[tokio::test]
async fn k_larger_than_the_right_side_returns_every_non_null_row() {
    let ctx = context();
    let want = reference(&ctx, "l", "r", "manhattan", "").await;
    let got = pairs(&query(&ctx, "SELECT * FROM knn_join(l, r, 'l1', 500)").await);
    check_knn("manhattan", 500, &got, &want, false);
    let non_null_right = want.values().next().unwrap().len();
    assert!(
        non_null_right > 60 && non_null_right < 90,
        "{non_null_right}"
    );
}

#[tokio::test]
async fn radius_join_equals_brute_force_for_every_metric() {
    let ctx = context();
    for kind in MetricKind::all() {
        let metric = kind.name();
        let options = options_for(kind);
        let (left, right) = tables_for(kind);
        let want = reference(&ctx, left, right, metric, options).await;
        // The median finite distance keeps about half the pairs.
        let mut all: Vec<f64> = want
            .values()
            .flatten()
            .map(|p| p.1)
            .filter(|d| d.is_finite())
            .collect();
        all.sort_by(f64::total_cmp);
        let radius = all[all.len() / 2];
        let sql = format!(
            "SELECT * FROM radius_join({left}, {right}, '{metric}', {radius:?}, '{options}')"
        );
        let got = pairs(&query(&ctx, &sql).await);
        let got_set: BTreeMap<(i64, i64), f64> =
            got.iter().map(|&(q, n, d, _)| ((q, n), d)).collect();
        assert_eq!(got_set.len(), got.len(), "{metric}: duplicate pairs");
        let within = |d: f64| {
            if kind.is_similarity() {
                d >= radius
            } else {
                d <= radius
            }
        };
        let mut expected = 0;
        for (q, row) in &want {
            for &(n, d) in row {
                let borderline = close(d, radius);
                match got_set.get(&(*q, n)) {
                    Some(&gd) => {
                        assert!(
                            close(gd, d),
                            "{metric}: ({q}, {n}) at {gd}, brute force {d}"
                        );
                        assert!(
                            within(d) || borderline,
                            "{metric}: ({q}, {n}) at {d} is outside {radius}"
                        );
                    }
                    None => assert!(
                        !within(d) || borderline,
                        "{metric}: ({q}, {n}) at {d} missing (radius {radius})"
                    ),
                }
                expected += within(d) as usize;
            }
        }
        assert!(
            expected > 0 && got.len() + 50 >= expected,
            "{metric}: {} pairs, expected about {expected}",
            got.len()
        );
        // Every result pair has non-null vectors on both sides.
        assert!(got_set
            .keys()
            .all(|k| want.get(&k.0).is_some_and(|r| r.iter().any(|p| p.0 == k.1))));
    }
}

#[tokio::test]
async fn exclude_self_skips_the_same_row_position_over_several_partitions() {
    let ctx = context();
    let want = reference(&ctx, "l", "l", "cosine", "").await;
    let got = pairs(
        &query(
            &ctx,
            "SELECT * FROM knn_join(l, l, 'cosine', 4, 'exclude_self=true')",
        )
        .await,
    );
    check_knn("cosine", 4, &got, &want, true);
    // Without the option a row is its own nearest neighbour whenever it is not the zero vector.
    let with_self = pairs(&query(&ctx, "SELECT * FROM knn_join(l, l, 'euclidean', 1)").await);
    assert!(
        with_self.iter().all(|&(q, n, d, _)| q == n || d == 0.0),
        "{with_self:?}"
    );
}

#[tokio::test]
async fn dataframe_api_builds_the_same_join() {
    let ctx = context();
    let left = ctx.table("l").await.unwrap();
    let right = ctx.table("r").await.unwrap();
    let df = planner::knn_join(left, right, "jaccard", 3, "device=cpu").unwrap();
    let names: Vec<String> = df
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "query_id",
            "query_label",
            "neighbor_id",
            "neighbor_label",
            "distance",
            "rank"
        ]
    );
    let want = reference(&ctx, "l", "r", "jaccard", "").await;
    check_knn(
        "jaccard",
        3,
        &pairs(&df.collect().await.unwrap()),
        &want,
        false,
    );

    let left = ctx.table("l").await.unwrap();
    let right = ctx.table("r").await.unwrap();
    let df = planner::radius_join(left, right, "dot", 2.0, "").unwrap();
    let got = pairs(&df.collect().await.unwrap());
    let want = reference(&ctx, "l", "r", "dot", "").await;
    let expected: usize = want.values().flatten().filter(|p| p.1 >= 2.0).count();
    assert_eq!(got.len(), expected);
    assert!(got.iter().all(|p| p.2 >= 2.0));

    let left = ctx.table("l").await.unwrap();
    let right = ctx.table("r").await.unwrap();
    let e = planner::knn_join(left, right, "cosine", 0, "")
        .unwrap_err()
        .to_string();
    assert!(e.contains("k must be a whole number >= 1"), "{e}");
}

#[tokio::test]
async fn udtf_form_takes_table_names_as_strings() {
    // A session with only the UDTFs: the relation planner is not there to catch the names.
    let config = SessionConfig::new().with_option_extension(SparseKnnConfig::default());
    let ctx = SessionContext::new_with_config(config);
    datafusion_sparse_knn::udf::register(&ctx).unwrap();
    planner::register_udtfs(&ctx);
    let mut rng = StdRng::seed_from_u64(7);
    let left = random_rows(&mut rng, 60, false);
    let right = random_rows(&mut rng, 90, false);
    ctx.register_table("l", table(&left, 0, 3)).unwrap();
    ctx.register_table("r", table(&right, 1000, 2)).unwrap();
    let want = reference(&ctx, "l", "r", "chebyshev", "").await;
    let got = pairs(&query(&ctx, "SELECT * FROM knn_join('l', 'r', 'chebyshev', 3)").await);
    check_knn("chebyshev", 3, &got, &want, false);
    // Projections reorder and drop columns.
    let batches = query(&ctx, "SELECT rank, neighbor_label, query_id FROM knn_join('l', 'r', 'cosine', 2) ORDER BY query_id, rank").await;
    let schema = batches[0].schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["rank", "neighbor_label", "query_id"]);
    let e = error(&ctx, "SELECT * FROM knn_join('l', 'nope', 'cosine', 2)").await;
    assert!(e.contains("'nope' is neither a registered table"), "{e}");
}

#[tokio::test]
async fn too_small_a_memory_limit_is_a_resources_error() {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(20_000, 1.0)
        .build_arc()
        .unwrap();
    let config = SessionConfig::new().with_option_extension(SparseKnnConfig::default());
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    datafusion_sparse_knn::register_all(&ctx).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let rows = random_rows(&mut rng, 3000, false);
    ctx.register_table("big", table(&rows, 0, 2)).unwrap();
    let e = error(&ctx, "SELECT * FROM knn_join(big, big, 'cosine', 3)").await;
    assert!(
        e.contains("Resources exhausted") && e.contains("KnnJoinExec"),
        "{e}"
    );
}

#[tokio::test]
async fn explain_names_the_operator_and_analyze_shows_its_metrics() {
    let ctx = context();
    let batches = query(
        &ctx,
        "EXPLAIN SELECT query_id FROM knn_join(l, r, 'cosine', 10, 'device=cpu')",
    )
    .await;
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string();
    assert!(
        text.contains("KnnJoinExec: metric=cosine, k=10, device=cpu"),
        "{text}"
    );
    assert!(
        text.contains("KnnJoin: metric=cosine, k=10, device=cpu"),
        "{text}"
    );
    let batches = query(
        &ctx,
        "EXPLAIN ANALYZE SELECT * FROM radius_join(l, r, 'l2', 1.5, 'device=cpu')",
    )
    .await;
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string();
    assert!(
        text.contains("RadiusJoinExec: metric=euclidean, radius=1.5, device=cpu"),
        "{text}"
    );
    let pairs_in_output = pairs(
        &query(
            &ctx,
            "SELECT * FROM radius_join(l, r, 'l2', 1.5, 'device=cpu')",
        )
        .await,
    )
    .len();
    let rows = format!("output_rows={pairs_in_output},");
    for metric in [
        "build_rows=90",
        "pairs=",
        "kernel_time=",
        "build_time=",
        rows.as_str(),
    ] {
        assert!(text.contains(metric), "{metric} missing: {text}");
    }
}

#[tokio::test]
async fn bad_arguments_say_what_is_valid() {
    let ctx = context();
    for (sql, needle) in [
        (
            "SELECT * FROM knn_join(l, r, 'cosine', 0)",
            "k) must be a whole number >= 1, got 0",
        ),
        (
            "SELECT * FROM knn_join(l, r, 'cosine', -3)",
            "k) must be a whole number >= 1, got -3",
        ),
        (
            "SELECT * FROM knn_join(l, r, 'cosine', 2.5)",
            "k) must be a whole number >= 1, got 2.5",
        ),
        (
            "SELECT * FROM knn_join(l, r, 'cosine', 'ten')",
            "k) must be a whole number >= 1",
        ),
        (
            "SELECT * FROM radius_join(l, r, 'cosine', -0.5)",
            "radius must be >= 0 for metric 'cosine'",
        ),
        (
            "SELECT * FROM knn_join(l, r, 'cosinus', 3)",
            "unknown metric 'cosinus'; valid metrics: dot",
        ),
        (
            "SELECT * FROM knn_join(l, r, 'cosine', 3, 'colour=red')",
            "unknown option 'colour'; valid keys",
        ),
        (
            "SELECT * FROM knn_join(l, r, 'hamming', 3)",
            "needs the dimension",
        ),
        ("SELECT * FROM knn_join(l, nope, 'cosine', 3)", "nope"),
        (
            "SELECT * FROM knn_join(l, r, 'cosine')",
            "takes 4 or 5 arguments, got 3",
        ),
        (
            "SELECT * FROM knn_join(l, r, 'cosine', 3, 'right_column=label')",
            "is not a sparse vector",
        ),
        (
            "SELECT * FROM knn_join(l, (SELECT id FROM r), 'cosine', 3)",
            "the right input has no sparse vector column",
        ),
        (
            "SELECT * FROM knn_join(lp, rp, 'kl', 3, 'dim=10')",
            "is out of range for dim=10",
        ),
        (
            "SELECT * FROM knn_join(l, r, 'hellinger', 3)",
            "negative value",
        ),
    ] {
        let e = error(&ctx, sql).await;
        assert!(e.contains(needle), "{sql}: {e}");
    }
    if !datafusion_sparse_knn::gpu::is_available() {
        let e = error(
            &ctx,
            "SELECT * FROM knn_join(l, r, 'cosine', 3, 'device=gpu')",
        )
        .await;
        assert!(e.contains("device=gpu but no CUDA GPU was found"), "{e}");
    }
}

#[tokio::test]
async fn validation_errors_name_the_column_and_row() {
    let ctx = context();
    let e = error(&ctx, "SELECT * FROM knn_join(l, r, 'hellinger', 3)").await;
    assert!(e.contains("sparse vector column 'v', row "), "{e}");
}

#[tokio::test]
async fn projection_reaches_the_inputs_and_subqueries_work() {
    let ctx = context();
    let batches = query(&ctx, "EXPLAIN SELECT neighbor_id, distance FROM knn_join(l, (SELECT * FROM r WHERE id < 1050), 'cosine', 2)").await;
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string();
    assert!(!text.contains("label"), "label should be pruned: {text}");
    let got = pairs(&query(&ctx, "SELECT query_id, neighbor_id, distance, rank FROM knn_join(l, (SELECT * FROM r WHERE id < 1050), 'cosine', 2)").await);
    assert!(!got.is_empty() && got.iter().all(|p| p.1 < 1050));
    // An empty right side gives no rows, not an error.
    let empty = query(
        &ctx,
        "SELECT * FROM knn_join(l, (SELECT * FROM r WHERE id < 0), 'cosine', 2)",
    )
    .await;
    assert_eq!(empty.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
    // A count(*) over the join needs no other column.
    let n = query(&ctx, "SELECT count(*) FROM knn_join(l, r, 'cosine', 2)").await;
    let n = n[0].column(0).as_primitive::<Int64Type>().value(0);
    let non_null = query(&ctx, "SELECT count(v) FROM l").await;
    let non_null = non_null[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(n, 2 * non_null);
}

#[tokio::test]
async fn output_comes_in_batches_of_the_session_batch_size() {
    let config = SessionConfig::new()
        .with_option_extension(SparseKnnConfig::default())
        .with_batch_size(7);
    let ctx = SessionContext::new_with_config(config);
    datafusion_sparse_knn::register_all(&ctx).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let left = random_rows(&mut rng, 60, false);
    let right = random_rows(&mut rng, 90, false);
    ctx.register_table("l", table(&left, 0, 3)).unwrap();
    ctx.register_table("r", table(&right, 1000, 2)).unwrap();
    let batches = query(&ctx, "SELECT * FROM knn_join(l, r, 'canberra', 5)").await;
    assert!(
        batches.iter().all(|b| b.num_rows() <= 7),
        "{:?}",
        batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>()
    );
    let want = reference(&ctx, "l", "r", "canberra", "").await;
    check_knn("canberra", 5, &pairs(&batches), &want, false);
}

/// On a machine with a CUDA GPU (the device runs), the GPU operator against the same brute force;
/// elsewhere this checks that `device=auto` fell back to the CPU and says so in EXPLAIN.
#[tokio::test]
async fn gpu_joins_equal_brute_force_when_a_gpu_is_present() {
    let ctx = context();
    let plan = query(
        &ctx,
        "EXPLAIN SELECT * FROM knn_join(l, r, 'cosine', 3, 'device=auto')",
    )
    .await;
    let text = arrow::util::pretty::pretty_format_batches(&plan)
        .unwrap()
        .to_string();
    if !datafusion_sparse_knn::gpu::is_available() {
        assert!(
            text.contains("KnnJoinExec: metric=cosine, k=3, device=cpu"),
            "{text}"
        );
        eprintln!("no CUDA GPU: checked the CPU fallback only");
        return;
    }
    assert!(
        text.contains("KnnJoinExec: metric=cosine, k=3, device=gpu"),
        "{text}"
    );
    for kind in MetricKind::all() {
        let metric = kind.name();
        let options = options_for(kind);
        let (left, right) = tables_for(kind);
        let want = reference(&ctx, left, right, metric, options).await;
        let sql = format!(
            "SELECT * FROM knn_join({left}, {right}, '{metric}', 5, '{options}, device=gpu')"
        );
        check_knn(metric, 5, &pairs(&query(&ctx, &sql).await), &want, false);
        let sql = format!("SELECT * FROM knn_join({left}, {left}, '{metric}', 3, '{options}, device=gpu, exclude_self=true')");
        let want_self = reference(&ctx, left, left, metric, options).await;
        check_knn(
            metric,
            3,
            &pairs(&query(&ctx, &sql).await),
            &want_self,
            true,
        );
    }
    // radius on the GPU: same pairs as on the CPU.
    for metric in ["euclidean", "dot", "jaccard"] {
        let count = |device: &str| {
            format!("SELECT count(*) FROM radius_join(l, r, '{metric}', 1.5, 'device={device}')")
        };
        let gpu = query(&ctx, &count("gpu")).await;
        let cpu = query(&ctx, &count("cpu")).await;
        assert_eq!(
            gpu[0].column(0).as_primitive::<Int64Type>().value(0),
            cpu[0].column(0).as_primitive::<Int64Type>().value(0),
            "{metric}"
        );
    }
    let analyzed = query(
        &ctx,
        "EXPLAIN ANALYZE SELECT * FROM knn_join(l, r, 'cosine', 3, 'device=gpu')",
    )
    .await;
    let text = arrow::util::pretty::pretty_format_batches(&analyzed)
        .unwrap()
        .to_string();
    assert!(
        text.contains("build_bytes_to_device=") && !text.contains("build_bytes_to_device=0,"),
        "{text}"
    );
    eprintln!("GPU joins checked on the device: {text}");
}

#[tokio::test]
async fn one_output_partition_per_left_partition_unless_exclude_self() {
    use datafusion::physical_plan::ExecutionPlanProperties;
    let ctx = context();
    let find = |plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>| {
        let mut stack = vec![Arc::clone(plan)];
        while let Some(p) = stack.pop() {
            if p.name() == "KnnJoinExec" {
                return p.output_partitioning().partition_count();
            }
            stack.extend(p.children().into_iter().cloned());
        }
        panic!("no KnnJoinExec in the plan")
    };
    let df = ctx
        .sql("SELECT * FROM knn_join(l, r, 'cosine', 2)")
        .await
        .unwrap();
    assert_eq!(find(&df.create_physical_plan().await.unwrap()), 3);
    let df = ctx
        .sql("SELECT * FROM knn_join(l, l, 'cosine', 2, 'exclude_self=true')")
        .await
        .unwrap();
    assert_eq!(find(&df.create_physical_plan().await.unwrap()), 1);
    // The partitions together hold every left row's neighbours exactly once.
    let df = ctx
        .sql("SELECT * FROM knn_join(l, r, 'cosine', 2)")
        .await
        .unwrap();
    let parts = df.collect_partitioned().await.unwrap();
    let rows: usize = parts.iter().flatten().map(|b| b.num_rows()).sum();
    let non_null = query(&ctx, "SELECT count(v) FROM l").await;
    let non_null = non_null[0].column(0).as_primitive::<Int64Type>().value(0) as usize;
    assert_eq!(rows, 2 * non_null);
}

/// Writes table `name` as a folder of Parquet files (one per partition).
async fn write_folder(
    ctx: &SessionContext,
    name: &str,
    folder: &std::path::Path,
) -> std::path::PathBuf {
    ctx.table(name)
        .await
        .unwrap()
        .write_parquet(folder.to_str().unwrap(), Default::default(), None)
        .await
        .unwrap();
    folder.to_path_buf()
}

#[tokio::test]
async fn parquet_file_and_folder_paths_are_inputs() {
    let ctx = context();
    let dir = tempfile::tempdir().unwrap();
    let folder = write_folder(&ctx, "l", &dir.path().join("left")).await;
    let files = std::fs::read_dir(&folder).unwrap().count();
    assert!(files >= 1, "{files}");
    let sorted = |mut v: Vec<(i64, i64, f64, i32)>| {
        v.sort_by_key(|a| (a.0, a.3));
        v
    };
    let from_table = sorted(pairs(
        &query(&ctx, "SELECT * FROM knn_join(l, r, 'cosine', 3)").await,
    ));
    let sql = format!(
        "SELECT * FROM knn_join('{}', r, 'cosine', 3)",
        folder.display()
    );
    let from_folder = sorted(pairs(&query(&ctx, &sql).await));
    assert_eq!(from_table, from_folder);
    let file = std::fs::read_dir(&folder)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let sql = format!(
        "SELECT count(*) FROM knn_join(r, '{}', 'cosine', 1)",
        file.display()
    );
    let n = query(&ctx, &sql).await;
    assert!(n[0].column(0).as_primitive::<Int64Type>().value(0) > 0);
}

/// exclude_self=true needs one input on both sides (row identity); between different inputs it
/// is an error that points to exclude_self=COLUMN, which skips pairs of equal COLUMN values for
/// any two inputs: subqueries, a folder of several files against the folder or one of its files,
/// several partitions, and a right side where every key appears twice.
#[tokio::test]
async fn exclude_self_by_identity_or_by_column() {
    let ctx = context();
    let dir = tempfile::tempdir().unwrap();
    let folder = write_folder(&ctx, "l", &dir.path().join("l"))
        .await
        .display()
        .to_string();
    let file = std::fs::read_dir(&folder)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .display()
        .to_string();
    let all_of_l = "(SELECT * FROM l WHERE id < 1000)";
    for (left, right) in [(all_of_l, "l"), ("l", &folder as &str), (&file, &folder)] {
        let quote = |s: &str| {
            if s.starts_with('/') {
                format!("'{s}'")
            } else {
                s.to_string()
            }
        };
        let sql = format!(
            "SELECT * FROM knn_join({}, {}, 'cosine', 3, 'exclude_self=true')",
            quote(left),
            quote(right)
        );
        let e = error(&ctx, &sql).await;
        assert!(
            e.contains("needs the same input on both sides") && e.contains("exclude_self=COLUMN"),
            "{sql}: {e}"
        );
    }
    let want = reference(&ctx, "l", "l", "cosine", "").await;
    for sql in [
        format!("SELECT * FROM knn_join({all_of_l}, l, 'cosine', 4, 'exclude_self=id')"),
        format!("SELECT * FROM knn_join(l, '{folder}', 'cosine', 4, 'exclude_self=id')"),
        format!("SELECT * FROM knn_join('{folder}', '{folder}', 'cosine', 4, 'exclude_self=true')"),
        format!("SELECT * FROM knn_join('{folder}', '{folder}', 'cosine', 4, 'exclude_self=ID')"),
    ] {
        let got = pairs(&query(&ctx, &sql).await);
        check_knn(&sql, 4, &got, &want, true);
    }
    // Every key twice on the right: both copies are skipped, k neighbours remain.
    ctx.sql("CREATE VIEW twice AS SELECT * FROM l UNION ALL SELECT * FROM l")
        .await
        .unwrap();
    let want = reference(&ctx, "l", "twice", "cosine", "").await;
    let got = pairs(
        &query(
            &ctx,
            "SELECT * FROM knn_join(l, twice, 'cosine', 5, 'exclude_self=id')",
        )
        .await,
    );
    check_knn("twice", 5, &got, &want, true);
    // A radius join too.
    let got = pairs(
        &query(
            &ctx,
            &format!("SELECT query_id, neighbor_id, distance FROM radius_join({all_of_l}, l, 'cosine', 0.5, 'exclude_self=id')"),
        )
        .await,
    );
    assert!(!got.is_empty() && got.iter().all(|p| p.0 != p.1), "{got:?}");
    let e = error(
        &ctx,
        "SELECT * FROM knn_join(l, r, 'cosine', 3, 'exclude_self=nope')",
    )
    .await;
    assert!(e.contains("has no column 'nope'"), "{e}");
}

/// A radius join whose output is every pair (36M) streams under a 200 MB memory pool: batches
/// of the session's size, the pool never over its limit, and every pair counted; a pool too
/// small for one probe slice is a resources error.
#[tokio::test]
async fn a_radius_join_matching_everything_streams_in_bounded_memory() {
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool, TrackConsumersPool};
    let limit = 200 * 1024 * 1024;
    let pool = Arc::new(TrackConsumersPool::new(
        GreedyMemoryPool::new(limit),
        std::num::NonZeroUsize::new(3).unwrap(),
    ));
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::clone(&pool) as Arc<dyn MemoryPool>)
        .build_arc()
        .unwrap();
    let config = SessionConfig::new().with_option_extension(SparseKnnConfig::default());
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    datafusion_sparse_knn::register_all(&ctx).unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let rows: Vec<_> = random_rows(&mut rng, 6000, true)
        .into_iter()
        .map(|r| {
            Some(r.unwrap_or_default())
                .filter(|v| !v.is_empty())
                .or(Some(vec![(1, 1.0)]))
        })
        .collect();
    ctx.register_table("d", table(&rows, 0, 1)).unwrap();
    let df = ctx
        .sql("SELECT query_id, distance FROM radius_join(d, d, 'cosine', 2.0, 'device=cpu')")
        .await
        .unwrap();
    let mut stream = df.execute_stream().await.unwrap();
    let (mut total, mut peak) = (0usize, 0usize);
    use futures::StreamExt;
    while let Some(batch) = stream.next().await {
        let batch = batch.unwrap();
        assert!(batch.num_rows() <= 8192, "{}", batch.num_rows());
        total += batch.num_rows();
        peak = peak.max(pool.reserved());
    }
    assert_eq!(total, 6000 * 6000);
    assert!(peak <= limit, "{peak}");

    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(4 * 1024 * 1024, 1.0)
        .build_arc()
        .unwrap();
    let config = SessionConfig::new().with_option_extension(SparseKnnConfig::default());
    let small = SessionContext::new_with_config_rt(config, runtime);
    datafusion_sparse_knn::register_all(&small).unwrap();
    small.register_table("d", table(&rows, 0, 1)).unwrap();
    let e = error(
        &small,
        "SELECT count(*) FROM radius_join(d, d, 'cosine', 2.0, 'device=cpu')",
    )
    .await;
    assert!(
        e.contains("Resources exhausted") && e.contains("RadiusJoinExec"),
        "{e}"
    );
}

/// The right side's partitions are read and converted concurrently, each counting its rows from
/// its own start: a bad vector in a later partition must still be named by its row in the whole
/// right side, whichever partition finishes first.
#[tokio::test]
async fn a_bad_right_vector_is_named_by_its_row_in_the_whole_side() {
    let ctx = datafusion_sparse_knn::session_context();
    let mut rng = StdRng::seed_from_u64(11);
    let left = random_rows(&mut rng, 10, true);
    let mut right = random_rows(&mut rng, 90, true);
    // Partitions of 30 rows: row 71 is the 12th row of the third.
    right[71] = Some(vec![(2, 4.0), (5, -3.0)]);
    ctx.register_table("l", table(&left, 0, 1)).unwrap();
    ctx.register_table("r", table(&right, 1000, 3)).unwrap();
    let message = error(
        &ctx,
        "SELECT * FROM knn_join(l, r, 'hellinger', 3, 'device=cpu')",
    )
    .await;
    assert!(
        message.contains("row 71: negative value -3 at index 5"),
        "{message}"
    );
}

/// Results of more pairs than one CPU part holds (64K) come as several record batches of whole
/// left rows: still in left order, every rank and pair as the brute force has them.
#[tokio::test]
async fn results_of_many_parts_keep_left_order_ranks_and_pairs() {
    let ctx = datafusion_sparse_knn::session_context();
    let mut rng = StdRng::seed_from_u64(11);
    let left = random_rows(&mut rng, 300, false);
    let right = random_rows(&mut rng, 400, false);
    ctx.register_table("l", table(&left, 0, 1)).unwrap();
    ctx.register_table("r", table(&right, 1000, 1)).unwrap();
    let want = reference(&ctx, "l", "r", "cosine", "").await;
    let total: usize = want.values().map(Vec::len).sum();
    assert!(total > 1 << 16, "{total} pairs: too few for several parts");
    let in_left_order = |got: &[(i64, i64, f64, i32)]| got.windows(2).all(|w| w[0].0 <= w[1].0);

    let got = pairs(
        &query(
            &ctx,
            "SELECT * FROM knn_join(l, r, 'cosine', 400, 'device=cpu')",
        )
        .await,
    );
    assert_eq!(got.len(), total);
    assert!(in_left_order(&got), "knn: left rows out of order");
    check_knn("cosine", 400, &got, &want, false);

    let got = pairs(
        &query(
            &ctx,
            "SELECT * FROM radius_join(l, r, 'cosine', 2.5, 'device=cpu')",
        )
        .await,
    );
    assert!(in_left_order(&got), "radius: left rows out of order");
    let got_set: BTreeMap<(i64, i64), f64> = got.iter().map(|&(q, n, d, _)| ((q, n), d)).collect();
    assert_eq!(
        got_set.len(),
        total,
        "radius 2.5 keeps every non-null pair once"
    );
    for (q, row) in &want {
        for &(n, d) in row {
            assert!(close(got_set[&(*q, n)], d), "({q}, {n})");
        }
    }
}

/// A Parquet file `(id, v)` of `rows` in row groups of `group_rows`, and a second file holding
/// its first row; the files live as long as the returned folder.
fn parquet_pair(
    rows: &[Option<Vec<(i32, f32)>>],
    group_rows: usize,
) -> (tempfile::TempDir, String, String) {
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    let vectors = SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", datafusion_sparse_knn::sparse_vector_type(), true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(0..rows.len() as i64)),
            Arc::new(vectors.to_array()),
        ],
    )
    .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows))
        .build();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, batch: &RecordBatch| {
        let path = dir.path().join(name);
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props.clone())).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        path.display().to_string()
    };
    let all = write("all.parquet", &batch);
    let first = write("first.parquet", &batch.slice(0, 1));
    (dir, all, first)
}

/// Lets the optimizer split these tests' small files into byte ranges, as it splits files of a
/// MB or more holding more than a batch of rows.
async fn split_small_files(ctx: &SessionContext) {
    query(
        ctx,
        "SET datafusion.optimizer.repartition_file_min_size = 0",
    )
    .await;
    query(ctx, "SET datafusion.execution.batch_size = 256").await;
}

/// Ties go to the right side's first rows in file order when the right side is one Parquet file
/// of many row groups, which the optimizer splits into byte ranges (one per partition). The
/// ranges used to be merged back by a `CoalescePartitionsExec` in the order they arrived, and
/// DataFusion's file-scan work stealing let a partition read another's row groups: a query that
/// ties with every row got rows of a later row group when the first one was slow to decode. The
/// plan now gathers the ranges in order, and the right side is read with stealing off (see
/// `a_scan_read_in_file_order_keeps_each_partition_to_its_own_ranges` for that part).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ties_follow_the_file_order_of_a_parquet_input_split_into_ranges() {
    // Row 0's vector {0: 1} has dot 1 with every row: all 6000 tie. The first row group's rows
    // are long.
    let rows: Vec<Option<Vec<(i32, f32)>>> = (0..6000)
        .map(|r| {
            let len = if r < 500 { 400 } else { 1 };
            Some((0..len).map(|c| (c, 1.0)).collect())
        })
        .collect();
    let (_dir, all, first) = parquet_pair(&rows, 500);
    for partitions in [2, 4, 8] {
        let ctx = datafusion_sparse_knn::session_context();
        query(
            &ctx,
            &format!("SET datafusion.execution.target_partitions = {partitions}"),
        )
        .await;
        split_small_files(&ctx).await;
        ctx.register_parquet("t", &all, Default::default())
            .await
            .unwrap();
        ctx.register_parquet("q", &first, Default::default())
            .await
            .unwrap();
        let plan = query(
            &ctx,
            "EXPLAIN SELECT neighbor_id FROM knn_join(q, t, 'dot', 5, 'device=cpu')",
        )
        .await;
        let plan = arrow::util::pretty::pretty_format_batches(&plan)
            .unwrap()
            .to_string();
        assert!(
            plan.contains(&format!("GatherExec: {partitions} partitions in order"))
                && !plan.contains("CoalescePartitionsExec"),
            "{partitions} partitions: the right side is not gathered in order:\n{plan}"
        );
        let cases: [(&str, Vec<i64>); 3] = [
            (
                "SELECT neighbor_id FROM knn_join(q, t, 'dot', 5, 'device=cpu')",
                vec![0, 1, 2, 3, 4],
            ),
            (
                "SELECT neighbor_id FROM knn_join(t, t, 'dot', 3, 'device=cpu, exclude_self=true') \
                 WHERE query_id = 0",
                vec![1, 2, 3],
            ),
            (
                "SELECT neighbor_id FROM knn_join(t, t, 'dot', 3, 'device=cpu, exclude_self=true') \
                 WHERE query_id = 700",
                vec![0, 1, 2],
            ),
        ];
        for (sql, want) in cases {
            let got: Vec<i64> = query(&ctx, &format!("{sql} ORDER BY rank"))
                .await
                .iter()
                .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                .collect();
            assert_eq!(got, want, "{partitions} partitions: {sql}");
        }
    }
}

/// A scan's partitions read under `planner::in_file_order` give the file's rows in order when
/// taken one after another, whichever partition is read first. Without it (DataFusion's default
/// file-scan work stealing) the last partition, read first to its end, also takes the ranges its
/// siblings had not opened yet, and the partitions in order no longer give the file's order.
#[tokio::test]
async fn a_scan_read_in_file_order_keeps_each_partition_to_its_own_ranges() {
    use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
    use futures::TryStreamExt;

    let rows: Vec<Option<Vec<(i32, f32)>>> = (0..4000).map(|r| Some(vec![(r % 7, 1.0)])).collect();
    let (_dir, all, _) = parquet_pair(&rows, 500);
    let ctx = datafusion_sparse_knn::session_context();
    query(&ctx, "SET datafusion.execution.target_partitions = 4").await;
    split_small_files(&ctx).await;
    ctx.register_parquet("t", &all, Default::default())
        .await
        .unwrap();
    fn scan(plan: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        if plan.name() == "DataSourceExec" {
            return Arc::clone(plan);
        }
        scan(plan.children()[0])
    }
    let plan = ctx
        .sql("SELECT id FROM t")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let scan = scan(&plan);
    let partitions = scan.output_partitioning().partition_count();
    assert_eq!(partitions, 4, "the file was not split into ranges");
    let context = planner::in_file_order(&ctx.task_ctx());
    let mut read = vec![Vec::new(); partitions];
    for p in (0..partitions).rev() {
        let batches: Vec<RecordBatch> = scan
            .execute(p, Arc::clone(&context))
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        read[p] = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
    }
    assert!(
        read.iter().all(|ids| !ids.is_empty()),
        "a partition read nothing: {:?}",
        read.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let in_order: Vec<i64> = read.concat();
    assert_eq!(in_order, (0..4000).collect::<Vec<i64>>());
}
