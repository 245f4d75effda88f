//! The GPU's distance matrix (`JoinIndex::distance_matrix`) against a float64 reference and the
//! CPU's, for every metric: the folded ones through the matrix kernel (kernels/matrix.cu), the
//! others through the probe it falls back to. Raw counts in the thousands, NULL rows, empty rows,
//! rows sharing no column with any other, a left row whose columns the right side lacks, explicit
//! zeros; given rows and the index's own rows; a stride wider than the columns (its gaps left as
//! they were); chunks, tiles and copy pieces made small with the kernel's testing knobs; a right
//! side in shards (each writing its own columns) and in parts streamed per probe (the fallback).
//!
//! These need a CUDA GPU: `cargo test --release --test it gpu_matrix -- --ignored
//! --test-threads=1`.

use datafusion_sparse_knn::cpu::{fills_dense_block, CpuIndex};
use datafusion_sparse_knn::gpu::{self, GpuIndex, GpuOptions};
use datafusion_sparse_knn::join::{join_shards, JoinIndex, MatrixOut, MatrixRows};
use datafusion_sparse_knn::metric::{Metric, MetricKind};
use datafusion_sparse_knn::SparseBatch;
use rayon::prelude::*;

use crate::common::{self, Row};

/// Coordinates: the counts use 0..60, the rows sharing no column 60..80.
const DIM: u64 = 80;
/// A value no distance takes: the gaps between a wide stride's rows must keep it.
const UNTOUCHED: f64 = -123_456.75;

/// The knobs of the matrix kernel and of the lists' tiles, set for one scope.
struct Knobs(Vec<&'static str>);

impl Knobs {
    fn set(pairs: &[(&'static str, &str)]) -> Self {
        for (k, v) in pairs {
            std::env::set_var(k, v);
        }
        Knobs(pairs.iter().map(|p| p.0).collect())
    }
}

impl Drop for Knobs {
    fn drop(&mut self) {
        for k in &self.0 {
            std::env::remove_var(k);
        }
    }
}

/// Chunks of 17 left rows, matrix tiles of two 64-row list tiles, copies in 1,000-byte pieces.
const SMALL: [(&str, &str); 4] = [
    ("SPARSE_KNN_GPU_TILE_ROWS", "64"),
    ("SPARSE_KNN_GPU_MATRIX_GROUP", "2"),
    ("SPARSE_KNN_GPU_MATRIX_ROWS", "17"),
    ("SPARSE_KNN_GPU_MATRIX_PIECE_BYTES", "1000"),
];

fn gpu_or_skip() -> bool {
    if !gpu::is_available() {
        eprintln!("no CUDA GPU: {}", gpu::describe());
        return false;
    }
    true
}

/// Raw counts (NULL rows among them) and rows of every edge the kernel finishes: empty, rows
/// sharing no column with any other row, an explicit zero, a long row.
fn right_rows() -> Vec<Row> {
    let mut rows = common::counts(410, 21);
    rows.push(Some(Vec::new()));
    rows.push(None);
    rows.push(Some(vec![(61, 1234.0), (62, 7.0)]));
    rows.push(Some(vec![(70, 3000.0)]));
    rows.push(Some(vec![(5, 0.0), (9, 1500.0), (71, 2.0)]));
    rows.push(Some(
        (0..60).map(|c| (c, (c * 37 % 2900 + 1) as f32)).collect(),
    ));
    rows.insert(3, Some(Vec::new()));
    rows
}

/// Other counts, some of the right rows (exact copies: distance 0), and left-only edges: a row
/// of columns no right row has, one sharing nothing, NULL and empty rows.
fn left_rows(right: &[Row]) -> Vec<Row> {
    let mut rows = common::counts(120, 22);
    rows.extend(right.iter().step_by(13).cloned());
    rows.push(Some(vec![(75, 42.0), (79, 8.0)]));
    rows.push(Some(vec![(65, 900.0)]));
    rows.push(None);
    rows.push(Some(Vec::new()));
    rows.push(Some(vec![(61, 1234.0), (62, 7.0), (3, 2.0)]));
    rows
}

fn metric(kind: MetricKind) -> Metric {
    let p = (kind == MetricKind::Minkowski).then_some(3.0);
    Metric::from_kind(kind, p, Some(DIM)).unwrap()
}

/// A matrix of `rows` x `columns` in an array of rows `stride` apart, the gaps `UNTOUCHED`.
struct Block {
    values: Vec<f64>,
    rows: usize,
    columns: usize,
    stride: usize,
}

impl Block {
    fn new(rows: usize, columns: usize, stride: usize) -> Self {
        let len = if rows == 0 {
            0
        } else {
            (rows - 1) * stride + columns
        };
        Block {
            values: vec![UNTOUCHED; len],
            rows,
            columns,
            stride,
        }
    }

    fn out(&mut self) -> MatrixOut<'_> {
        MatrixOut {
            values: &mut self.values,
            stride: self.stride,
            columns: self.columns,
        }
    }

    fn at(&self, r: usize, j: usize) -> f64 {
        self.values[r * self.stride + j]
    }

    fn gaps_untouched(&self) -> bool {
        (0..self.rows.saturating_sub(1)).all(|r| {
            self.values[r * self.stride + self.columns..(r + 1) * self.stride]
                .iter()
                .all(|&v| v.to_bits() == UNTOUCHED.to_bits())
        })
    }
}

fn matrix(
    index: &dyn JoinIndex,
    m: &Metric,
    left: MatrixRows<'_>,
    n: usize,
    stride: usize,
) -> Block {
    let mut block = Block::new(left.rows().len(), n, stride);
    index
        .distance_matrix(m, left, block.out())
        .unwrap_or_else(|e| panic!("{}: distance matrix: {e}", m.kind));
    assert!(
        block.gaps_untouched(),
        "{}: a gap between rows was written",
        m.kind
    );
    block
}

/// `got` against `want` (both finite, or the same infinity, or both NaN) within `rel` of
/// max(1, |want|).
fn close(got: f64, want: f64, rel: f64) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= rel * want.abs().max(1.0)
}

/// Every value of `got` against the float64 reference of its pair: NaN exactly where either row
/// is NULL; a folded metric within 1e-6 of max(1, |reference|), the others within the SPEC's
/// allowance.
fn check_reference(label: &str, m: &Metric, got: &Block, left: &[Row], right: &[Row]) {
    let folded = fills_dense_block(m);
    let bad: Vec<String> = (0..got.rows)
        .into_par_iter()
        .flat_map_iter(|r| {
            (0..got.columns).filter_map(move |j| {
                let d = got.at(r, j);
                let (x, y) = match (&left[r], &right[j]) {
                    (Some(x), Some(y)) => (x, y),
                    _ => {
                        return (!d.is_nan()).then(|| format!("({r}, {j}): NULL row gave {d}"));
                    }
                };
                let want = common::reference(m.kind, m.p, Some(DIM), x, y);
                let ok = if folded {
                    close(d, want, 1e-6)
                } else {
                    common::tolerance_ok(m.kind, d, want, x, y)
                };
                (!ok).then(|| {
                    format!(
                        "({r}, {j}): {d} against {want}; x {} y {}",
                        common::show(x),
                        common::show(y)
                    )
                })
            })
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{label} {}: {} values off the reference, first: {:?}",
        m.kind,
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}

/// `got` against the CPU's matrix of the same pairs: the folded metrics' sums are the same
/// terms in nearly the same order (1e-8 leaves room for a logarithm's last bit in kl_divergence),
/// the others within the SPEC's allowance of each other.
fn check_cpu(label: &str, m: &Metric, got: &Block, cpu: &Block) {
    let rel = if fills_dense_block(m) { 1e-8 } else { 1e-4 };
    for r in 0..got.rows {
        for j in 0..got.columns {
            let (g, c) = (got.at(r, j), cpu.at(r, j));
            assert!(
                close(g, c, rel),
                "{label} {}: ({r}, {j}) GPU {g} CPU {c}",
                m.kind
            );
        }
    }
}

/// `a` and `b` hold the same bits (the kernel's sums take one order whatever the chunks, tiles
/// and copies).
fn check_same_bits(label: &str, m: &Metric, a: &Block, b: &Block) {
    for r in 0..a.rows {
        for j in 0..a.columns {
            let (x, y) = (a.at(r, j), b.at(r, j));
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{label} {}: ({r}, {j}) {x} against {y}",
                m.kind
            );
        }
    }
}

/// Given rows (a stride 5 wider than the columns) and the index's own rows, for one metric:
/// returns both matrices.
fn both_matrices(
    index: &dyn JoinIndex,
    m: &Metric,
    left: &SparseBatch,
    right: &SparseBatch,
) -> (Block, Block) {
    let n = right.len();
    let given = matrix(index, m, MatrixRows::Given(left), n, n + 5);
    let own = matrix(index, m, MatrixRows::Own(right), n, n);
    (given, own)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_metric_matches_the_reference_and_the_cpu() {
    if !gpu_or_skip() {
        return;
    }
    let right_rows = right_rows();
    let left_rows = left_rows(&right_rows);
    let (right, left) = (common::batch(&right_rows), common::batch(&left_rows));
    for kind in MetricKind::all() {
        let m = metric(kind);
        let cpu = CpuIndex::build(&right, &m);
        let gpu = GpuIndex::build(&right, &m, &GpuOptions::default())
            .unwrap_or_else(|e| panic!("{kind}: build: {e}"));
        assert_eq!(
            gpu.matrix_on_device(),
            fills_dense_block(&m),
            "{kind}: the matrix kernel computes exactly the CPU's dense-block metrics"
        );
        let (given, own) = both_matrices(&gpu, &m, &left, &right);
        check_reference("given", &m, &given, &left_rows, &right_rows);
        check_reference("own", &m, &own, &right_rows, &right_rows);
        let (cpu_given, cpu_own) = both_matrices(&cpu, &m, &left, &right);
        check_cpu("given", &m, &given, &cpu_given);
        check_cpu("own", &m, &own, &cpu_own);

        // Chunks of 17 left rows, tiles of 128 right rows, copies in 1,000-byte pieces: the same
        // bits for the kernel's metrics, the same values for the others.
        let small = Knobs::set(&SMALL);
        let gpu_small = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
        let (given_small, own_small) = both_matrices(&gpu_small, &m, &left, &right);
        drop(small);
        if fills_dense_block(&m) {
            check_same_bits("small chunks, given", &m, &given_small, &given);
            check_same_bits("small chunks, own", &m, &own_small, &own);
        } else {
            check_cpu("small chunks, given", &m, &given_small, &cpu_given);
            check_cpu("small chunks, own", &m, &own_small, &cpu_own);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_sharded_right_side_writes_each_shards_columns() {
    if !gpu_or_skip() {
        return;
    }
    let right_rows = right_rows();
    let left_rows = left_rows(&right_rows);
    let (right, left) = (common::batch(&right_rows), common::batch(&left_rows));
    let n = right.len();
    let cut = 150;
    for kind in [
        MetricKind::Cosine,
        MetricKind::Euclidean,
        MetricKind::KlDivergence,
        MetricKind::BrayCurtis,
        MetricKind::Chebyshev,
    ] {
        let m = metric(kind);
        let whole = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
        let shards: Vec<(usize, Box<dyn JoinIndex>)> = [(0, cut), (cut, n - cut)]
            .into_iter()
            .map(|(first, rows)| {
                let part = right.slice(first, rows);
                let index = GpuIndex::build(&part, &m, &GpuOptions::default()).unwrap();
                (rows, Box::new(index) as Box<dyn JoinIndex>)
            })
            .collect();
        let sharded = join_shards(shards, kind == MetricKind::Dot, false).unwrap();
        let (given, own) = both_matrices(&whole, &m, &left, &right);
        for pieces in [None, Some("4096")] {
            let knobs = Knobs::set(&[("SPARSE_KNN_GPU_MATRIX_PIECE_BYTES", pieces.unwrap_or(""))]);
            let (given_sharded, own_sharded) = both_matrices(sharded.as_ref(), &m, &left, &right);
            drop(knobs);
            if fills_dense_block(&m) {
                check_same_bits("sharded, given", &m, &given_sharded, &given);
                check_same_bits("sharded, own", &m, &own_sharded, &own);
            } else {
                check_cpu("sharded, given", &m, &given_sharded, &given);
                check_cpu("sharded, own", &m, &own_sharded, &own);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_right_side_streamed_in_parts_falls_back_to_the_probe() {
    if !gpu_or_skip() {
        return;
    }
    let right_rows = right_rows();
    let left_rows = left_rows(&right_rows);
    let (right, left) = (common::batch(&right_rows), common::batch(&left_rows));
    for kind in [MetricKind::Cosine, MetricKind::Euclidean, MetricKind::Dot] {
        let m = metric(kind);
        // 30 KB: the right side goes in parts, uploaded per probe.
        let options = GpuOptions {
            memory_limit: Some(30_000),
            ..Default::default()
        };
        let gpu = GpuIndex::build(&right, &m, &options).unwrap();
        assert!(
            gpu.parts() > 1,
            "{kind}: the limit should cut the right side"
        );
        assert!(!gpu.matrix_on_device(), "{kind}: parts take the probe");
        let (given, own) = both_matrices(&gpu, &m, &left, &right);
        check_reference("parts, given", &m, &given, &left_rows, &right_rows);
        check_reference("parts, own", &m, &own, &right_rows, &right_rows);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_matrix_needs_the_indexs_columns_and_room() {
    if !gpu_or_skip() {
        return;
    }
    let right_rows = right_rows();
    let right = common::batch(&right_rows);
    let n = right.len();
    let m = metric(MetricKind::Cosine);
    let gpu = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
    let mut short = vec![0.0; n * 2 - 1];
    let err = gpu
        .distance_matrix(
            &m,
            MatrixRows::Own(&right),
            MatrixOut {
                values: &mut short,
                stride: n,
                columns: n,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
    let mut values = vec![0.0; n * 3];
    let err = gpu
        .distance_matrix(
            &m,
            MatrixRows::Given(&right.slice(0, 3)),
            MatrixOut {
                values: &mut values,
                stride: n,
                columns: n - 1,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("columns"), "{err}");
    let other = metric(MetricKind::Euclidean);
    let err = gpu
        .distance_matrix(
            &other,
            MatrixRows::Given(&right.slice(0, 3)),
            MatrixOut {
                values: &mut values,
                stride: n,
                columns: n,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("built for"), "{err}");
}
