//! Shared test helpers: a seeded random sparse-row generator with the SPEC's edge cases, a plain
//! float64 reference of every metric written from the SPEC table (dense over the union of the
//! supports, or over all `d` coordinates where the metric needs `d`), and the SPEC tolerance.
#![allow(dead_code)]

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Float64Type, Int32Type, Int64Type, Schema};
use datafusion::prelude::SessionContext;
use datafusion_sparse_knn::join::PairList;
use datafusion_sparse_knn::metric::MetricKind;
use datafusion_sparse_knn::vector::VectorCheck;
use datafusion_sparse_knn::SparseBatch;
use parquet::arrow::ArrowWriter;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// A row as `(index, value)` pairs in any order; `None` is a NULL vector.
pub type Row = Option<Vec<(i32, f32)>>;

/// The `sparse-knn` cargo built, or `SPARSE_KNN_BIN` (the GPU machine runs the test binary away
/// from the build tree).
pub fn sparse_knn_bin() -> String {
    std::env::var("SPARSE_KNN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sparse-knn").to_string())
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// What the random rows look like.
#[derive(Debug, Clone)]
pub struct GenOptions {
    pub rows: usize,
    /// Indices are drawn from `0..dim`.
    pub dim: i32,
    /// Largest ordinary degree (a few "hub" rows get up to `min(dim / 2, 400)`).
    pub max_degree: usize,
    /// Only values > 0 (hellinger, jensenshannon, kl_divergence).
    pub nonnegative: bool,
    /// Some rows are NULL.
    pub nulls: bool,
    /// Rows sometimes carry explicit zero values (which are not part of the support).
    pub explicit_zeros: bool,
    /// Rows sometimes list their entries out of index order.
    pub unsorted: bool,
    /// Rows sometimes have values of magnitude up to 1e5 or down to 1e-20.
    pub extreme_values: bool,
}

impl GenOptions {
    pub fn new(rows: usize, dim: i32) -> Self {
        Self {
            rows,
            dim,
            max_degree: 40.min(dim as usize),
            nonnegative: false,
            nulls: true,
            explicit_zeros: true,
            unsorted: true,
            extreme_values: true,
        }
    }

    pub fn nonnegative(mut self, yes: bool) -> Self {
        self.nonnegative = yes;
        self
    }

    pub fn nulls(mut self, yes: bool) -> Self {
        self.nulls = yes;
        self
    }

    pub fn extreme_values(mut self, yes: bool) -> Self {
        self.extreme_values = yes;
        self
    }

    pub fn max_degree(mut self, d: usize) -> Self {
        self.max_degree = d.min(self.dim as usize);
        self
    }
}

/// Skewed column popularity: low indices are much more frequent (hub columns).
fn skewed_index(rng: &mut StdRng, dim: i32) -> i32 {
    let u: f64 = rng.random();
    ((u * u * u) * dim as f64).min(dim as f64 - 1.0) as i32
}

/// A value of the given scale; `integer` rows look like counts (many exact ties).
fn value(rng: &mut StdRng, scale: f64, nonnegative: bool, integer: bool) -> f32 {
    let mut v = if integer {
        rng.random_range(1..6) as f64
    } else {
        rng.random_range(0.05..1.0) * scale
    };
    if !nonnegative && rng.random_bool(0.3) {
        v = -v;
    }
    v as f32
}

/// `n` distinct indices from `0..dim` (skewed), none in `avoid`.
fn distinct_indices(rng: &mut StdRng, n: usize, dim: i32, avoid: &[i32]) -> Vec<i32> {
    let room = dim as usize - avoid.len();
    let n = n.min(room);
    let mut out: Vec<i32> = Vec::with_capacity(n);
    let mut tries = 0;
    while out.len() < n {
        let i = if tries < 20 * n {
            skewed_index(rng, dim)
        } else {
            rng.random_range(0..dim)
        };
        tries += 1;
        if !out.contains(&i) && !avoid.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// Seeded random rows covering the edge cases: NULL, empty, single nonzero, exact and near
/// copies of an earlier row, the same support with other values, a support disjoint from an earlier row,
/// skewed (log-uniform) degrees with hub rows, count-like integer rows, large and tiny values,
/// explicit zeros and unsorted entries.
pub fn random_rows(rng: &mut StdRng, o: &GenOptions) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::with_capacity(o.rows);
    for _ in 0..o.rows {
        let earlier: Vec<&Vec<(i32, f32)>> = rows.iter().flatten().collect();
        let kind = rng.random_range(0..100);
        let scale = if o.extreme_values {
            match rng.random_range(0..10) {
                0 => 1e5,
                1 => 1e-20,
                2 => 1e-3,
                _ => 1.0,
            }
        } else {
            1.0
        };
        let integer = rng.random_bool(0.25);
        let mut row: Vec<(i32, f32)> = if o.nulls && kind < 5 {
            rows.push(None);
            continue;
        } else if kind < 10 {
            Vec::new()
        } else if kind < 18 {
            vec![(
                skewed_index(rng, o.dim),
                value(rng, scale, o.nonnegative, integer),
            )]
        } else if kind < 28 && !earlier.is_empty() {
            // An exact copy: ties in every metric.
            earlier[rng.random_range(0..earlier.len())].clone()
        } else if kind < 32 && !earlier.is_empty() {
            // A near copy: every value moved by a relative 1e-6 (near-duplicate documents).
            let base = earlier[rng.random_range(0..earlier.len())];
            base.iter()
                .map(|&(i, v)| {
                    (
                        i,
                        (v as f64 * (1.0 + 1e-6 * rng.random_range(-1.0..1.0))) as f32,
                    )
                })
                .collect()
        } else if kind < 36 && !earlier.is_empty() {
            let base = earlier[rng.random_range(0..earlier.len())];
            base.iter()
                .map(|&(i, _)| (i, value(rng, scale, o.nonnegative, integer)))
                .collect()
        } else if kind < 44 && !earlier.is_empty() {
            let base = earlier[rng.random_range(0..earlier.len())];
            let avoid: Vec<i32> = base.iter().map(|e| e.0).collect();
            let n = rng.random_range(1..=o.max_degree.max(1));
            distinct_indices(rng, n, o.dim, &avoid)
                .into_iter()
                .map(|i| (i, value(rng, scale, o.nonnegative, integer)))
                .collect()
        } else {
            let n = if rng.random_bool(0.05) {
                // A hub row.
                rng.random_range(1..=(o.dim as usize / 2).clamp(1, 400))
            } else {
                let u: f64 = rng.random();
                ((o.max_degree.max(1) as f64).powf(u)) as usize
            };
            distinct_indices(rng, n, o.dim, &[])
                .into_iter()
                .map(|i| (i, value(rng, scale, o.nonnegative, integer)))
                .collect()
        };
        if o.explicit_zeros && rng.random_bool(0.15) {
            let avoid: Vec<i32> = row.iter().map(|e| e.0).collect();
            let n = rng.random_range(1..3);
            for i in distinct_indices(rng, n, o.dim, &avoid) {
                row.push((i, 0.0));
            }
        }
        if o.unsorted && rng.random_bool(0.5) {
            row.shuffle(rng);
        } else {
            row.sort_by_key(|e| e.0);
        }
        rows.push(Some(row));
    }
    rows
}

/// A batch of the rows, validated as the SPEC requires (unsorted indices are accepted).
pub fn batch(rows: &[Row]) -> SparseBatch {
    let b = SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()));
    VectorCheck::new("test")
        .validate(&b)
        .expect("generated rows are valid");
    b
}

/// The metric kinds by canonical name, with the `dim` they need.
pub fn kind_of(name: &str) -> MetricKind {
    name.parse().unwrap()
}

/// `row`'s entries by increasing index, as float64.
fn sorted_entries(row: &[(i32, f32)]) -> Vec<(i64, f64)> {
    let mut entries: Vec<(i64, f64)> = row.iter().map(|&(i, v)| (i as i64, v as f64)).collect();
    entries.sort_unstable_by_key(|e| e.0);
    assert!(
        entries.windows(2).all(|w| w[0].0 != w[1].0),
        "duplicate index in a test row"
    );
    entries
}

/// Plain float64 reference from the SPEC table. `x` is the left (query) row. Coordinates are the
/// union of both rows' stored indices, or all of `0..d` for the metrics defined over `d`.
pub fn reference(
    kind: MetricKind,
    p: f64,
    dim: Option<u64>,
    x: &[(i32, f32)],
    y: &[(i32, f32)],
) -> f64 {
    use MetricKind::*;
    let (sx, sy) = (sorted_entries(x), sorted_entries(y));
    // Both rows' values at the coordinates, in increasing coordinate order.
    let (xs, ys): (Vec<f64>, Vec<f64>) = if kind.needs_dim() {
        let d = dim.expect("metric needs dim") as usize;
        let dense = |entries: &[(i64, f64)]| {
            let mut values = vec![0.0; d];
            for &(i, v) in entries.iter().filter(|e| (0..d as i64).contains(&e.0)) {
                values[i as usize] = v;
            }
            values
        };
        (dense(&sx), dense(&sy))
    } else {
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        let (mut a, mut b) = (0, 0);
        while a < sx.len() || b < sy.len() {
            let next = match (sx.get(a), sy.get(b)) {
                (Some(l), Some(r)) => l.0.min(r.0),
                (Some(l), None) => l.0,
                (None, Some(r)) => r.0,
                (None, None) => unreachable!(),
            };
            let take = |entries: &[(i64, f64)], at: &mut usize| match entries.get(*at) {
                Some(e) if e.0 == next => {
                    *at += 1;
                    e.1
                }
                _ => 0.0,
            };
            xs.push(take(&sx, &mut a));
            ys.push(take(&sy, &mut b));
        }
        (xs, ys)
    };
    let pairs = || xs.iter().copied().zip(ys.iter().copied());
    let dot: f64 = pairs().map(|(a, b)| a * b).sum();
    let nx = xs.iter().map(|a| a * a).sum::<f64>().sqrt();
    let ny = ys.iter().map(|b| b * b).sum::<f64>().sqrt();
    let nz_x = xs.iter().filter(|a| **a != 0.0).count() as f64;
    let nz_y = ys.iter().filter(|b| **b != 0.0).count() as f64;
    let both = pairs().filter(|(a, b)| *a != 0.0 && *b != 0.0).count() as f64;
    match kind {
        Dot => dot,
        Cosine => {
            if nx == 0.0 || ny == 0.0 {
                1.0
            } else {
                1.0 - dot / (nx * ny)
            }
        }
        Euclidean => pairs().map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt(),
        SqEuclidean => pairs().map(|(a, b)| (a - b) * (a - b)).sum(),
        Manhattan => pairs().map(|(a, b)| (a - b).abs()).sum(),
        Chebyshev => pairs().map(|(a, b)| (a - b).abs()).fold(0.0, f64::max),
        Minkowski => pairs()
            .map(|(a, b)| (a - b).abs().powf(p))
            .sum::<f64>()
            .powf(1.0 / p),
        Canberra => pairs()
            .map(|(a, b)| {
                let den = a.abs() + b.abs();
                if den == 0.0 {
                    0.0
                } else {
                    (a - b).abs() / den
                }
            })
            .sum(),
        BrayCurtis => {
            let num: f64 = pairs().map(|(a, b)| (a - b).abs()).sum();
            let den: f64 = pairs().map(|(a, b)| (a + b).abs()).sum();
            if den == 0.0 {
                if num == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                num / den
            }
        }
        Hamming => pairs().filter(|(a, b)| a != b).count() as f64 / xs.len() as f64,
        Jaccard => {
            let union = nz_x + nz_y - both;
            if union == 0.0 {
                0.0
            } else {
                1.0 - both / union
            }
        }
        Dice => {
            if nz_x + nz_y == 0.0 {
                0.0
            } else {
                1.0 - 2.0 * both / (nz_x + nz_y)
            }
        }
        RussellRao => (xs.len() as f64 - both) / xs.len() as f64,
        Correlation => {
            let constant = |v: &[f64]| v.iter().all(|a| *a == v[0]);
            if constant(&xs) || constant(&ys) {
                return 1.0;
            }
            let n = xs.len() as f64;
            let (ax, ay) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
            let cov: f64 = pairs().map(|(a, b)| (a - ax) * (b - ay)).sum();
            let vx: f64 = xs.iter().map(|a| (a - ax) * (a - ax)).sum();
            let vy: f64 = ys.iter().map(|b| (b - ay) * (b - ay)).sum();
            1.0 - cov / (vx.sqrt() * vy.sqrt())
        }
        Hellinger => {
            (pairs()
                .map(|(a, b)| (a.sqrt() - b.sqrt()).powi(2))
                .sum::<f64>())
            .sqrt()
                / std::f64::consts::SQRT_2
        }
        JensenShannon => {
            let xlogx_m = |a: f64, m: f64| if a > 0.0 { a * (a / m).ln() } else { 0.0 };
            let s: f64 = pairs()
                .map(|(a, b)| {
                    let m = (a + b) / 2.0;
                    xlogx_m(a, m) + xlogx_m(b, m)
                })
                .sum();
            (s / 2.0).sqrt()
        }
        KlDivergence => pairs()
            .filter(|(a, _)| *a > 0.0)
            .map(|(a, b)| {
                if b == 0.0 {
                    f64::INFINITY
                } else {
                    a * (a / b).ln()
                }
            })
            .sum(),
    }
}

/// ‖x‖₂² of a row, in float64.
pub fn norm2sq(row: &[(i32, f32)]) -> f64 {
    row.iter().map(|e| e.1 as f64 * e.1 as f64).sum()
}

/// The SPEC's accuracy: within 1e-4 · max(1, |reference|); for euclidean, sqeuclidean and
/// correlation also an absolute error up to 1e-3 · √(‖x‖₂² + ‖y‖₂²). Infinities must match.
pub fn tolerance_ok(
    kind: MetricKind,
    got: f64,
    reference: f64,
    x: &[(i32, f32)],
    y: &[(i32, f32)],
) -> bool {
    if got.is_nan() || reference.is_nan() {
        return false;
    }
    if got.is_infinite() || reference.is_infinite() {
        return got == reference;
    }
    let err = (got - reference).abs();
    if err <= 1e-4 * reference.abs().max(1.0) {
        return true;
    }
    matches!(
        kind,
        MetricKind::Euclidean | MetricKind::SqEuclidean | MetricKind::Correlation
    ) && err <= 1e-3 * (norm2sq(x) + norm2sq(y)).sqrt()
}

/// A short description of a row for failure messages.
pub fn show(row: &[(i32, f32)]) -> String {
    let mut s: Vec<String> = row
        .iter()
        .take(12)
        .map(|(i, v)| format!("{i}:{v:e}"))
        .collect();
    if row.len() > 12 {
        s.push(format!("... ({} entries)", row.len()));
    }
    format!("[{}]", s.join(" "))
}

/// `(query id, neighbor id, distance, rank)` rows of a join's output whose columns are named
/// so, in output order (rank 0 where there is none: a radius join).
pub fn pairs(batches: &[RecordBatch]) -> Vec<(i64, i64, f64, i32)> {
    let mut out = Vec::new();
    for b in batches {
        let col = |name: &str| b.column_by_name(name).unwrap();
        let q = col("query_id").as_primitive::<Int64Type>();
        let n = col("neighbor_id").as_primitive::<Int64Type>();
        let d = col("distance").as_primitive::<Float64Type>();
        let r = b
            .column_by_name("rank")
            .map(|r| r.as_primitive::<Int32Type>().clone());
        for i in 0..b.num_rows() {
            let rank = r.as_ref().map_or(0, |r| r.value(i));
            out.push((q.value(i), n.value(i), d.value(i), rank));
        }
    }
    out
}

/// Two joins' `pairs` (one a fresh build over fewer rows) are the same answer: equal rows and ranks; distances equal to 1e-12 relative (a fresh build over fewer rows may
/// choose other dense columns, whose sums run in another order), and where two neighbours tie
/// that closely either order is right.
pub fn assert_same_pairs(got: &[(i64, i64, f64, i32)], want: &[(i64, i64, f64, i32)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: pairs");
    let close = |a: f64, b: f64| a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!((g.0, g.3), (w.0, w.3), "{what}: pair {i}");
        assert!(close(g.2, w.2), "{what}: pair {i}: {g:?} against {w:?}");
        if g.1 != w.1 {
            // A near-tie: the other order must hold the same neighbours at the same distance.
            let other = want
                .iter()
                .find(|x| x.0 == g.0 && x.1 == g.1)
                .unwrap_or_else(|| panic!("{what}: pair {i}: {g:?} not among {w:?}'s row"));
            assert!(close(other.2, g.2), "{what}: pair {i}: {g:?} against {w:?}");
        }
    }
}

/// (left, right, distance, rank within the left row) of a probe's pairs (left row order, then rank).
pub fn ranked(pairs: &PairList) -> Vec<(i64, i64, f64, i32)> {
    let mut out = Vec::with_capacity(pairs.len());
    let mut rank = 0;
    for i in 0..pairs.len() {
        rank = if i > 0 && pairs.left[i] == pairs.left[i - 1] {
            rank + 1
        } else {
            0
        };
        out.push((
            pairs.left[i] as i64,
            pairs.right[i] as i64,
            pairs.distance[i],
            rank,
        ));
    }
    out
}

/// Raw counts in the thousands, as users' bag-of-words and single-cell data have.
pub fn counts(rows: usize, seed: u64) -> Vec<Row> {
    let mut r = rng(seed);
    let options = GenOptions::new(rows, 60).nonnegative(true);
    random_rows(&mut r, &options)
        .into_iter()
        .map(|row| {
            row.map(|entries| {
                entries
                    .into_iter()
                    .map(|(c, v)| (c, (v.abs() * 997.0).round().max(1.0)))
                    .collect()
            })
        })
        .collect()
}

pub fn batch_of(rows: &[Row], first_id: i64) -> RecordBatch {
    let vectors = SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", datafusion_sparse_knn::sparse_vector_type(), true),
    ]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(
        first_id..first_id + rows.len() as i64,
    ));
    RecordBatch::try_new(schema, vec![ids, Arc::new(vectors.to_array())]).unwrap()
}

pub fn write_parquet(path: &Path, rows: &[Row], first_id: i64) {
    let batch = batch_of(rows, first_id);
    let mut writer =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

pub async fn collect(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The join's counters `names` (e.g. `index_built`) from EXPLAIN ANALYZE of `sql`.
pub async fn explain_counters(ctx: &SessionContext, sql: &str, names: &[&str]) -> Vec<usize> {
    let batches = collect(ctx, &format!("EXPLAIN ANALYZE {sql}")).await;
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string();
    names
        .iter()
        .map(|name| {
            let at = text
                .find(&format!("{name}="))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"));
            text[at + name.len() + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap()
        })
        .collect()
}

/// Held by the tests that run an in-process cluster (`standalone_context`): its executors share
/// one index cache per process, whose build counters a test reads, and the tests are modules of
/// one binary now, run side by side.
pub static IN_PROCESS_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
