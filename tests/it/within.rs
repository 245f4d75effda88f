//! `within=COLUMN` (SPEC "Filtered right sides"): each left row's neighbours are the right rows
//! of its own group, exactly as a fresh join of the group's left rows with the group's right rows
//! alone would answer, for every metric, knn and radius, with a right-side filter and with
//! `exclude_self=true`; a NULL key (either side) or a key no right row has matches nothing. The
//! kept index serves every grouping: a new `within` or filter is a mask, not a build.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use datafusion_sparse_knn::metric::MetricKind;

use crate::common::{self, collect, counts, explain_counters, write_parquet};

fn options_for(kind: MetricKind) -> &'static str {
    match kind {
        MetricKind::Minkowski => "p=3",
        k if k.needs_dim() => "dim=60",
        _ => "",
    }
}

/// Right rows in groups 0-3 (every 11th a NULL key); left rows in groups 0-4 (no right row has
/// 4; every 13th a NULL key).
async fn grouped_session() -> (tempfile::TempDir, SessionContext) {
    let dir = tempfile::tempdir().unwrap();
    let right = dir.path().join("right.parquet");
    let left = dir.path().join("left.parquet");
    write_parquet(&right, &counts(300, 41), 0);
    write_parquet(&left, &counts(45, 42), 1000);
    let ctx = datafusion_sparse_knn::session_context();
    for (name, path) in [("r0", &right), ("l0", &left)] {
        ctx.register_parquet(name, path.to_str().unwrap(), Default::default())
            .await
            .unwrap();
    }
    let groups = [
        ("r", "r0", "CASE WHEN id % 11 = 0 THEN NULL ELSE id % 4 END"),
        ("l", "l0", "CASE WHEN id % 13 = 0 THEN NULL ELSE id % 5 END"),
    ];
    for (name, source, group) in groups {
        copy(&ctx, name, &format!("SELECT *, {group} AS g FROM {source}")).await;
    }
    (dir, ctx)
}

/// The rows of `query` as an in-memory table `name` (a fresh build's input).
async fn copy(ctx: &SessionContext, name: &str, query: &str) {
    let df = ctx.sql(query).await.unwrap();
    let schema = df.schema().inner().clone();
    let rows = df.collect().await.unwrap();
    let table = MemTable::try_new(schema, vec![rows]).unwrap();
    let _ = ctx.deregister_table(name);
    ctx.register_table(name, Arc::new(table)).unwrap();
}

/// (query id, neighbor id, distance, rank) sorted by query id then rank (then neighbour for a
/// radius join's rank-less pairs).
fn answer(batches: &[RecordBatch]) -> Vec<(i64, i64, f64, i32)> {
    let mut pairs = common::pairs(batches);
    pairs.sort_by_key(|a| (a.0, a.3, a.1));
    pairs
}

/// The join of each group's left rows with its right rows (that pass `right_filter`), each a
/// fresh build, in one answer.
async fn per_group(
    ctx: &SessionContext,
    function: &str,
    param: &str,
    metric: &str,
    options: &str,
    right_filter: &str,
    self_join: bool,
) -> Vec<(i64, i64, f64, i32)> {
    let mut all = Vec::new();
    for g in 0..4 {
        copy(
            ctx,
            "rg",
            &format!("SELECT * FROM r WHERE g = {g} AND ({right_filter})"),
        )
        .await;
        let left = if self_join {
            "rg".to_string()
        } else {
            copy(ctx, "lg", &format!("SELECT * FROM l WHERE g = {g}")).await;
            "lg".to_string()
        };
        let sql = format!(
            "SELECT * FROM {function}({left}, rg, '{metric}', {param}, 'device=cpu, {options}')"
        );
        all.extend(common::pairs(&collect(ctx, &sql).await));
    }
    all.sort_by_key(|a| (a.0, a.3, a.1));
    all
}

#[tokio::test]
async fn each_left_row_gets_its_groups_nearest_for_every_metric() {
    let (_dir, ctx) = grouped_session().await;
    for kind in MetricKind::all() {
        let metric = kind.name();
        let options = options_for(kind);
        for right_filter in ["true", "id % 3 = 0", "id = 5"] {
            let sql = format!(
                "SELECT * FROM knn_join(l, (SELECT * FROM r WHERE {right_filter}), '{metric}', \
                 6, 'device=cpu, within=g, {options}')"
            );
            let got = answer(&collect(&ctx, &sql).await);
            let want = per_group(&ctx, "knn_join", "6", metric, options, right_filter, false).await;
            let what = format!("{metric}, {right_filter}");
            common::assert_same_pairs(&got, &want, &what);
            // Left rows of a NULL key or of group 4 (no right row has it) have no neighbours.
            assert!(
                got.iter().all(|p| p.0 % 13 != 0 && p.0 % 5 != 4),
                "{what}: a left row of no group got neighbours"
            );
        }
    }
}

#[tokio::test]
async fn radius_joins_and_self_joins_stay_within_the_group() {
    let (_dir, ctx) = grouped_session().await;
    // A radius that keeps some pairs of a group and not others (cosine distances of these
    // counts run from about 0.2 to 1).
    let sql = "SELECT * FROM radius_join(l, r, 'cosine', 0.75, 'device=cpu, within=g')";
    let got = answer(&collect(&ctx, sql).await);
    let want = per_group(&ctx, "radius_join", "0.75", "cosine", "", "true", false).await;
    assert!(
        !want.is_empty() && want.len() < 45 * 70,
        "the radius keeps some pairs"
    );
    common::assert_same_pairs(&got, &want, "radius, cosine");

    for metric in ["euclidean", "jensenshannon"] {
        let sql = format!(
            "SELECT * FROM knn_join(r, r, '{metric}', 4, 'device=cpu, within=g, exclude_self=true')"
        );
        let got = answer(&collect(&ctx, &sql).await);
        let want = per_group(
            &ctx,
            "knn_join",
            "4",
            metric,
            "exclude_self=true",
            "true",
            true,
        )
        .await;
        common::assert_same_pairs(&got, &want, &format!("{metric}, self-join"));
        assert!(
            got.iter().all(|p| p.0 != p.1),
            "{metric}: a row paired with itself"
        );
    }
}

#[tokio::test]
async fn a_new_grouping_reuses_the_kept_index() {
    let (_dir, ctx) = grouped_session().await;
    let names = ["index_built", "index_reused"];
    let plain = "SELECT * FROM knn_join(l, r, 'cosine', 3, 'device=cpu')";
    assert_eq!(explain_counters(&ctx, plain, &names).await, vec![1, 0]);
    let grouped = "SELECT * FROM knn_join(l, r, 'cosine', 3, 'device=cpu, within=g')";
    assert_eq!(explain_counters(&ctx, grouped, &names).await, vec![0, 1]);
    let filtered = "SELECT * FROM knn_join(l, (SELECT * FROM r WHERE id % 2 = 0), 'cosine', 3, \
                    'device=cpu, within=g')";
    assert_eq!(explain_counters(&ctx, filtered, &names).await, vec![0, 1]);
}

#[tokio::test]
async fn a_within_column_must_be_a_key_of_both_inputs() {
    let (_dir, ctx) = grouped_session().await;
    for (options, expected) in [
        (
            "within=tenant",
            "within=tenant: the left input has no column 'tenant'",
        ),
        ("within=v", "'v' is the left input's vector column"),
        ("within=", "option within must be a column name"),
        ("within=a.b", "option within must be a column name"),
    ] {
        let sql = format!("SELECT * FROM knn_join(l, r, 'cosine', 3, '{options}')");
        let err = match ctx.sql(&sql).await {
            Ok(df) => df.collect().await.unwrap_err(),
            Err(e) => e,
        };
        assert!(
            err.to_string().contains(expected),
            "{options}: {err} does not say {expected}"
        );
    }
    // The right input lacks it.
    let sql = "SELECT * FROM knn_join(l, r0, 'cosine', 3, 'within=g')";
    let err = ctx.sql(sql).await.unwrap_err().to_string();
    assert!(
        err.contains("within=g: the right input has no column 'g'"),
        "{err}"
    );
}

/// A right side in shards (past 2^31 entries, or over several GPUs): each shard compares the
/// groups of its own rows, and the merged answer is that of one index of every row, with and
/// without a filter, for every metric.
#[test]
fn a_sharded_index_answers_a_grouped_probe_as_one_index() {
    use arrow::array::{ArrayRef, Int64Array};
    use datafusion_sparse_knn::cpu::CpuIndex;
    use datafusion_sparse_knn::join::{
        Cancel, GroupMembers, GroupedProbe, JoinIndex, ProbeOptions, RowMask, Selection, Shard,
        ShardedIndex,
    };
    use datafusion_sparse_knn::metric::Metric;

    let rows = counts(500, 51);
    let right = common::batch(&rows);
    let left = common::batch(&counts(40, 52));
    let right_keys: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..500i64).map(|r| (r % 13 != 0).then_some(r % 5)),
    ));
    let left_keys: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..40i64).map(|r| (r % 7 != 0).then_some(r % 6)),
    ));
    let members = GroupMembers::build(&right_keys).unwrap();
    let groups = members.left_groups(&left_keys).unwrap();
    let filter = RowMask::new((0..500).map(|r| r % 3 != 1).collect());
    for kind in MetricKind::all() {
        let p = (kind == MetricKind::Minkowski).then_some(3.0);
        let metric = Metric::from_kind(kind, p, kind.needs_dim().then_some(60)).unwrap();
        let whole = CpuIndex::build(&right, &metric);
        let cuts = [(0, 170), (170, 200), (370, 130)];
        let shards = cuts
            .iter()
            .map(|&(first, n)| Shard {
                first_row: first,
                rows: n,
                index: Arc::new(CpuIndex::build(
                    &common::batch(&rows[first..first + n]),
                    &metric,
                )) as Arc<dyn JoinIndex>,
            })
            .collect();
        let sharded = ShardedIndex::new(shards, kind.is_similarity(), false).unwrap();
        for mask in [None, Some(&filter)] {
            let probe = |index: &dyn JoinIndex| {
                index
                    .probe_grouped(
                        &left,
                        GroupedProbe::new(&groups, &members, mask),
                        Selection::Nearest(6),
                        ProbeOptions::default(),
                        &Cancel::new(),
                    )
                    .unwrap()
                    .into_pairs()
            };
            let (want, got) = (probe(&whole), probe(&sharded));
            assert!(!want.is_empty(), "{kind:?}: the groups find rows");
            for i in 0..got.len() {
                let (l, r) = (got.left[i] as usize, got.right[i] as usize);
                assert_eq!(groups[l], members.right_groups()[r], "{kind:?}: pair {i}");
                assert!(mask.is_none_or(|m| m.allows(r)), "{kind:?}: pair {i}");
            }
            common::assert_same_pairs(
                &common::ranked(&got),
                &common::ranked(&want),
                &format!("{kind:?}, filter {}", mask.is_some()),
            );
        }
    }
}
