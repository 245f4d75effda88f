//! Property tests over seeded random cases (a bounded number so CI stays fast; `PROPERTY_CASES=N`
//! runs more, `PROPERTY_SEED=S` another sequence): random vector columns of every accepted layout,
//! random joins against the float64 reference of the SPEC, and random SQL arguments. Whatever the
//! input, no panic: a clear error or a right answer. A failure names its case's seed.
//!
//! (proptest was weighed: its features re-resolve num-traits for the whole dependency graph, so
//! the tests would rebuild Arrow and DataFusion apart from the CLI; seeded cases cost no build.)

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::common::{reference, tolerance_ok};
use arrow::array::{
    ArrayRef, Float32Builder, Float64Builder, Int32Builder, Int64Builder, LargeListBuilder,
    ListBuilder, MapBuilder, RecordBatch, StructArray, UInt32Builder,
};
use arrow::datatypes::{DataType, Field, Fields, Schema};
use datafusion::datasource::MemTable;
use datafusion_sparse_knn::cpu::{probe, CpuIndex, ProbeOptions, Selection};
use datafusion_sparse_knn::metric::{Metric, MetricKind};
use datafusion_sparse_knn::vector::VectorCheck;
use datafusion_sparse_knn::SparseBatch;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Entries = Vec<(i32, f32)>;

/// Values as users have them (raw counts up to 1e5, fractions, zeros), and now and then a bad one.
fn value(rng: &mut StdRng, bad: bool) -> f32 {
    if bad && rng.random_bool(0.05) {
        return if rng.random_bool(0.5) {
            f32::NAN
        } else {
            f32::INFINITY
        };
    }
    match rng.random_range(0..10) {
        0..=3 => rng.random_range(1u32..2000) as f32,
        4 | 5 => rng.random_range(1u32..100_000) as f32,
        6 | 7 => rng.random_range(1e-3f32..3.0),
        8 => 0.0,
        _ => -(rng.random_range(1u32..500) as f32),
    }
}

/// Rows of (index, value), some NULL; indices may repeat within a row.
fn rows(rng: &mut StdRng, n: std::ops::Range<usize>, dim: i32, bad: bool) -> Vec<Option<Entries>> {
    let count = rng.random_range(n);
    (0..count)
        .map(|_| {
            rng.random_bool(0.9).then(|| {
                let deg = rng.random_range(0..24);
                (0..deg)
                    .map(|_| (rng.random_range(0..dim), value(rng, bad)))
                    .collect()
            })
        })
        .collect()
}

/// Runs `case` on `PROPERTY_CASES` (default 64) seeded generators, naming the seed of a failure.
fn for_cases(name: &str, case: impl Fn(&mut StdRng)) {
    let env = |key: &str, default: u64| {
        std::env::var(key)
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(default)
    };
    let (cases, base) = (env("PROPERTY_CASES", 64), env("PROPERTY_SEED", 1));
    for i in 0..cases {
        let seed = base.wrapping_mul(1_000_003).wrapping_add(i);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            case(&mut StdRng::seed_from_u64(seed))
        }));
        if let Err(e) = outcome {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!(
                "{name}: the case of seed {seed} (PROPERTY_SEED={base}, case {i}) failed: {msg}"
            );
        }
    }
}

fn has_problem(rows: &[Option<Entries>]) -> bool {
    rows.iter().flatten().any(|r| {
        let mut seen = std::collections::HashSet::new();
        r.iter().any(|&(i, v)| !v.is_finite() || !seen.insert(i))
    })
}

fn sorted_nonzeros(r: &[(i32, f32)]) -> Vec<(i32, f32)> {
    let mut v: Vec<(i32, f32)> = r.iter().copied().filter(|e| e.1 != 0.0).collect();
    v.sort_by_key(|e| e.0);
    v
}

/// The layouts of the SPEC: canonical, widened types, LargeList, UInt32 indices, Map, dense.
#[derive(Debug, Clone, Copy)]
enum Layout {
    Canonical,
    Int64Float64,
    UInt32Float32,
    LargeList,
    Map,
    Dense,
}

fn struct_array(fields: Vec<(&str, ArrayRef)>, valid: &[bool]) -> ArrayRef {
    let fields_def = Fields::from(
        fields
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    );
    Arc::new(StructArray::new(
        fields_def,
        fields.into_iter().map(|f| f.1).collect(),
        Some(valid.iter().copied().collect()),
    ))
}

fn encode(rows: &[Option<Entries>], layout: Layout, dim: i32) -> ArrayRef {
    let valid: Vec<bool> = rows.iter().map(|r| r.is_some()).collect();
    let empty = Vec::new();
    let each = || rows.iter().map(|r| r.as_ref().unwrap_or(&empty));
    match layout {
        Layout::Canonical | Layout::LargeList | Layout::Int64Float64 | Layout::UInt32Float32 => {
            macro_rules! lists {
                ($ib:expr, $vb:expr, $icast:expr, $vcast:expr) => {{
                    let (mut ib, mut vb) = ($ib, $vb);
                    for r in each() {
                        for &(i, v) in r {
                            ib.values().append_value($icast(i));
                            vb.values().append_value($vcast(v));
                        }
                        ib.append(true);
                        vb.append(true);
                    }
                    struct_array(
                        vec![
                            ("indices", Arc::new(ib.finish())),
                            ("values", Arc::new(vb.finish())),
                        ],
                        &valid,
                    )
                }};
            }
            match layout {
                Layout::Canonical => lists!(
                    ListBuilder::new(Int32Builder::new()),
                    ListBuilder::new(Float32Builder::new()),
                    |i: i32| i,
                    |v: f32| v
                ),
                Layout::LargeList => lists!(
                    LargeListBuilder::new(Int32Builder::new()),
                    LargeListBuilder::new(Float32Builder::new()),
                    |i: i32| i,
                    |v: f32| v
                ),
                Layout::Int64Float64 => lists!(
                    ListBuilder::new(Int64Builder::new()),
                    ListBuilder::new(Float64Builder::new()),
                    |i: i32| i as i64,
                    |v: f32| v as f64
                ),
                _ => lists!(
                    ListBuilder::new(UInt32Builder::new()),
                    ListBuilder::new(Float32Builder::new()),
                    |i: i32| i as u32,
                    |v: f32| v
                ),
            }
        }
        Layout::Map => {
            let mut b = MapBuilder::new(None, Int32Builder::new(), Float32Builder::new());
            for r in rows {
                match r {
                    Some(r) => {
                        for &(i, v) in r {
                            b.keys().append_value(i);
                            b.values().append_value(v);
                        }
                        b.append(true).unwrap();
                    }
                    None => b.append(false).unwrap(),
                }
            }
            Arc::new(b.finish())
        }
        Layout::Dense => {
            let mut b = ListBuilder::new(Float64Builder::new());
            for r in rows {
                match r {
                    Some(r) => {
                        // A duplicate index cannot be written densely: the last one wins here.
                        let mut dense = vec![0.0f64; dim as usize];
                        for &(i, v) in r {
                            dense[i as usize] = v as f64;
                        }
                        for v in dense {
                            b.values().append_value(v);
                        }
                        b.append(true);
                    }
                    None => b.append(false),
                }
            }
            Arc::new(b.finish())
        }
    }
}

const LAYOUTS: [Layout; 6] = [
    Layout::Canonical,
    Layout::Int64Float64,
    Layout::UInt32Float32,
    Layout::LargeList,
    Layout::Map,
    Layout::Dense,
];

/// Any column of any accepted layout converts to exactly its rows, or fails with an error naming
/// the column when a row has a duplicate index or a non-finite value.
#[test]
fn every_layout_converts_or_says_why() {
    for_cases("every_layout_converts_or_says_why", |rng| {
        let rows = rows(rng, 1..12, 40, true);
        let layout = LAYOUTS[rng.random_range(0..LAYOUTS.len())];
        let array = encode(&rows, layout, 40);
        let result = SparseBatch::try_from_array(array.as_ref(), &VectorCheck::new("emb"));
        // Dense rows cannot hold a duplicate; what they hold is the last value per index.
        let expected: Vec<Option<Entries>> = rows
            .iter()
            .map(|r| {
                r.as_ref().map(|r| match layout {
                    Layout::Dense => r
                        .iter()
                        .copied()
                        .collect::<BTreeMap<i32, f32>>()
                        .into_iter()
                        .collect(),
                    _ => r.clone(),
                })
            })
            .collect();
        if has_problem(&expected) {
            let err = result.expect_err("a duplicate index or a non-finite value must be an error");
            assert!(err.to_string().contains("emb"), "{layout:?}: {err}");
        } else {
            let batch = result.unwrap_or_else(|e| panic!("{layout:?}: {e}"));
            assert_eq!(batch.len(), rows.len());
            for (i, r) in expected.iter().enumerate() {
                assert_eq!(batch.is_null(i), r.is_none(), "{layout:?} row {i}");
                if let Some(r) = r {
                    let (idx, val) = batch.row(i);
                    let got: Entries = idx.iter().copied().zip(val.iter().copied()).collect();
                    assert_eq!(
                        sorted_nonzeros(&got),
                        sorted_nonzeros(r),
                        "{layout:?} row {i}"
                    );
                }
            }
        }
    });
}

/// A CPU kNN join of random raw-count rows keeps, for every left row, the k nearest by the
/// float64 reference (rank by rank within the SPEC tolerance), for any of the 17 metrics.
#[test]
fn cpu_knn_matches_the_float64_reference() {
    let kinds: Vec<MetricKind> = MetricKind::all().collect();
    for_cases("cpu_knn_matches_the_float64_reference", |rng| {
        let kind = kinds[rng.random_range(0..kinds.len())];
        let k = rng.random_range(1usize..8);
        let mut fix = |n: std::ops::Range<usize>| -> Vec<Option<Entries>> {
            rows(rng, n, 60, false)
                .into_iter()
                .map(|r| {
                    r.map(|r| {
                        let m: BTreeMap<i32, f32> = r
                            .into_iter()
                            .map(|(i, v)| (i, if kind.needs_nonnegative() { v.abs() } else { v }))
                            .collect();
                        m.into_iter().collect()
                    })
                })
                .collect()
        };
        let (left, right) = (fix(1..8), fix(1..30));
        let p = (kind == MetricKind::Minkowski).then_some(3.0);
        let metric = Metric::from_kind(kind, p, Some(60)).unwrap();
        let lb = SparseBatch::from_rows(left.iter().map(|r| r.as_deref()));
        let rb = SparseBatch::from_rows(right.iter().map(|r| r.as_deref()));
        let index = CpuIndex::build(&rb, &metric);
        let pairs = probe(&index, &lb, Selection::Nearest(k), ProbeOptions::default());
        for (i, l) in left.iter().enumerate() {
            let got: Vec<(u32, f64)> = (0..pairs.len())
                .filter(|&p| pairs.left[p] as usize == i)
                .map(|p| (pairs.right[p], pairs.distance[p]))
                .collect();
            let Some(l) = l else {
                assert!(got.is_empty(), "a NULL left row matched");
                continue;
            };
            let mut want: Vec<f64> = right
                .iter()
                .flatten()
                .map(|r| reference(kind, metric.p, metric.dim, l, r))
                .collect();
            if kind.is_similarity() {
                want.sort_by(|a, b| b.total_cmp(a));
            } else {
                want.sort_by(|a, b| a.total_cmp(b));
            }
            want.truncate(k);
            assert_eq!(got.len(), want.len(), "{kind} k={k}: row {i}");
            for (rank, (&(j, d), &w)) in got.iter().zip(&want).enumerate() {
                let r = right[j as usize]
                    .as_ref()
                    .expect("a NULL right row matched");
                let truth = reference(kind, metric.p, metric.dim, l, r);
                assert!(
                    tolerance_ok(kind, d, truth, l, r),
                    "{kind}: row {i} rank {rank}: {d}, true {truth}"
                );
                assert!(
                    tolerance_ok(kind, d, w, l, r),
                    "{kind}: row {i} rank {rank}: {d}, ranked {w}"
                );
            }
        }
    });
}

/// Random SQL arguments (metric names, k, radius, options) get an answer or an error, never a
/// panic or a hang.
#[test]
fn random_sql_arguments_never_panic() {
    let kinds: Vec<MetricKind> = MetricKind::all().collect();
    // Every key the options string accepts, and one it does not.
    let keys: Vec<&str> = datafusion_sparse_knn::options::OPTION_KEYS
        .iter()
        .copied()
        .chain(["bogus"])
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ctx = datafusion_sparse_knn::session_context();
    let table: Vec<Option<Entries>> = (0..12)
        .map(|i| (i != 5).then(|| vec![(i % 7, 1.0 + i as f32), (7 + i % 3, 250.0)]))
        .collect();
    let vectors = SparseBatch::from_rows(table.iter().map(|r| r.as_deref()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("v", datafusion_sparse_knn::sparse_vector_type(), true),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(arrow::array::Int32Array::from_iter_values(0..12)),
            Arc::new(vectors.to_array()),
        ],
    )
    .unwrap();
    ctx.register_table(
        "t",
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()),
    )
    .unwrap();
    let pick = |rng: &mut StdRng, alphabet: &str| -> String {
        let chars: Vec<char> = alphabet.chars().collect();
        (0..rng.random_range(0..7))
            .map(|_| chars[rng.random_range(0..chars.len())])
            .collect()
    };
    let answered = std::sync::atomic::AtomicUsize::new(0);
    for_cases("random_sql_arguments_never_panic", |rng| {
        let metric = if rng.random_bool(0.7) {
            kinds[rng.random_range(0..kinds.len())].name().to_string()
        } else {
            pick(rng, "abcdefghijklmnopqrstuvwxyz_ABC")
        };
        let k: i64 = match rng.random_range(0..4) {
            0 => i64::MAX,
            1 => 0,
            _ => rng.random_range(-3..40),
        };
        let radius = if rng.random_bool(0.1) {
            f64::NAN
        } else {
            rng.random_range(-2.0..3.0)
        };
        let mut options = String::new();
        for _ in 0..rng.random_range(0..3) {
            let key = keys[rng.random_range(0..keys.len())];
            let value = match rng.random_range(0..4) {
                0 => "cpu".to_string(),
                1 => "true".to_string(),
                2 => format!("{}", rng.random_range(-100.0..5000.0f64)),
                _ => pick(rng, "az=,' 0"),
            };
            options.push_str(&format!("{key}={value}, "));
        }
        // The device is always pinned: CI has no GPU, and `auto` is not what is fuzzed here.
        let options = format!("{options}device=cpu").replace('\'', "''");
        let sql = if rng.random_bool(0.5) {
            format!("SELECT * FROM radius_join(t, t, '{metric}', {radius}, '{options}')")
        } else {
            format!("SELECT * FROM knn_join(t, t, '{metric}', {k}, '{options}')")
        };
        runtime.block_on(async {
            // Either outcome is fine; a panic fails the case.
            if let Ok(df) = ctx.sql(&sql).await {
                if df.collect().await.is_ok() {
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
    });
    // Not only errors: a good share of the random calls are valid and run to the end.
    let answered = answered.into_inner();
    assert!(
        answered >= 4,
        "only {answered} random calls ran to an answer"
    );
}
