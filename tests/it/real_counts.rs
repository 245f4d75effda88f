//! Real raw counts (the bundled PBMC UMI counts and 20 Newsgroups word counts, as they are and
//! scaled to a maximum of 1e5 like bulk RNA-seq or read counts) against the float64 reference of
//! the SPEC, for all 17 metric names, on both backends; and determinism on data full of ties.
//!
//! The CPU cases run in CI; the GPU ones need a CUDA GPU:
//! `cargo test --release --test real_counts -- --ignored --test-threads=1`.

use std::fs::File;

use crate::common::{reference, tolerance_ok, Row};
use arrow::array::{Array, StructArray};
use datafusion_sparse_knn::cpu::{CpuIndex, PairList, ProbeOptions, Selection};
use datafusion_sparse_knn::gpu::{self, GpuIndex, GpuOptions};
use datafusion_sparse_knn::join::JoinIndex;
use datafusion_sparse_knn::metric::{Metric, MetricKind};
use datafusion_sparse_knn::SparseBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rayon::prelude::*;

/// The rows of a bundled Parquet file's `vec` column, values multiplied by `scale_to / max`
/// when `scale_to` is given.
fn load(path: &str, scale_to: Option<f32>) -> Vec<Row> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let mut rows: Vec<Row> = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let vec = batch.column_by_name("vec").unwrap();
        let vec = vec.as_any().downcast_ref::<StructArray>().unwrap();
        let b = SparseBatch::try_from_array(
            vec,
            &datafusion_sparse_knn::vector::VectorCheck::new("vec"),
        )
        .unwrap();
        for r in 0..b.len() {
            let (i, v) = b.row(r);
            rows.push(Some(i.iter().copied().zip(v.iter().copied()).collect()));
        }
    }
    if let Some(to) = scale_to {
        let max = rows
            .iter()
            .flatten()
            .flatten()
            .map(|e| e.1)
            .fold(0.0f32, f32::max);
        for row in rows.iter_mut().flatten() {
            for e in row.iter_mut() {
                e.1 = (e.1 as f64 * to as f64 / max as f64) as f32;
            }
        }
    }
    rows
}

fn batch(rows: &[Row]) -> SparseBatch {
    SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()))
}

/// Every metric name of the SPEC (minkowski at a fractional, a unit and a large p).
fn metrics(dim: u64) -> Vec<Metric> {
    let mut out = Vec::new();
    for kind in MetricKind::all() {
        if kind == MetricKind::Minkowski {
            for p in [1.0, 1.5, 3.0, 12.0] {
                out.push(Metric::from_kind(kind, Some(p), Some(dim)).unwrap());
            }
        } else {
            out.push(Metric::from_kind(kind, None, Some(dim)).unwrap());
        }
    }
    out
}

/// The k nearest of each query by brute force over the float64 reference (ties to the smaller
/// right row), and the check of a backend's answer against it: the same count, distances within
/// the SPEC's tolerance rank by rank, and every returned pair's distance its reference distance.
fn check_against_reference(
    label: &str,
    metric: &Metric,
    queries: &[usize],
    right_rows: &[Row],
    k: usize,
    got: &PairList,
) {
    let (kind, p, dim) = (metric.kind, metric.p, metric.dim);
    let sign = if kind.is_similarity() { -1.0 } else { 1.0 };
    let failures: Vec<String> = queries
        .par_iter()
        .enumerate()
        .flat_map_iter(|(qi, &q)| {
            let x = right_rows[q].as_deref().unwrap();
            let mut all: Vec<(f64, usize)> = right_rows
                .iter()
                .enumerate()
                .filter_map(|(j, y)| y.as_deref().map(|y| (reference(kind, p, dim, x, y), j)))
                .collect();
            all.sort_by(|a, b| (sign * a.0).total_cmp(&(sign * b.0)).then(a.1.cmp(&b.1)));
            all.truncate(k);
            let mine: Vec<(u32, f64)> = (0..got.len())
                .filter(|&i| got.left[i] as usize == qi)
                .map(|i| (got.right[i], got.distance[i]))
                .collect();
            let mut errs = Vec::new();
            if mine.len() != all.len() {
                errs.push(format!(
                    "{label}: query {q}: {} pairs, reference {}",
                    mine.len(),
                    all.len()
                ));
                return errs.into_iter();
            }
            for (rank, ((rd, _), (j, d))) in all.iter().zip(&mine).enumerate() {
                let y = right_rows[*j as usize].as_deref().unwrap();
                if !tolerance_ok(kind, *d, *rd, x, y) {
                    errs.push(format!(
                        "{label}: query {q} rank {rank}: distance {d}, reference {rd}"
                    ));
                }
                let truth = reference(kind, p, dim, x, y);
                if !tolerance_ok(kind, *d, truth, x, y) {
                    errs.push(format!(
                        "{label}: query {q}: pair with right row {j} has distance {d}, its reference is {truth}"
                    ));
                }
            }
            errs.into_iter()
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} failures, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(12)].join("\n")
    );
}

enum Backend {
    Cpu,
    Gpu,
}

fn probe(
    backend: &Backend,
    right: &SparseBatch,
    metric: &Metric,
    left: &SparseBatch,
    k: usize,
) -> PairList {
    let index: Box<dyn JoinIndex> = match backend {
        Backend::Cpu => Box::new(CpuIndex::build(right, metric)),
        Backend::Gpu => Box::new(GpuIndex::build(right, metric, &GpuOptions::default()).unwrap()),
    };
    index
        .probe(left, Selection::Nearest(k), ProbeOptions::default())
        .unwrap_or_else(|e| panic!("{metric}: {e}"))
        .into_pairs()
}

fn check_dataset(
    backend: &Backend,
    path: &str,
    dim: u64,
    scale_to: Option<f32>,
    n_queries: usize,
    n_right: usize,
) {
    let mut rows = load(path, scale_to);
    rows.truncate(n_right);
    let step = (rows.len() / n_queries).max(1);
    let queries: Vec<usize> = (0..rows.len()).step_by(step).take(n_queries).collect();
    let right = batch(&rows);
    let left_rows: Vec<Row> = queries.iter().map(|&q| rows[q].clone()).collect();
    let left = batch(&left_rows);
    for metric in metrics(dim) {
        let got = probe(backend, &right, &metric, &left, 10);
        let label = format!("{path} scaled to {scale_to:?}, {metric}");
        check_against_reference(&label, &metric, &queries, &rows, 10, &got);
    }
}

const PBMC: &str = "data/pbmc_facs_counts.parquet";
const PBMC_DIM: u64 = 16_791;
const NEWS20: &str = "data/news20_bow.parquet";
const NEWS20_DIM: u64 = 173_762;

#[test]
fn cpu_pbmc_counts_as_they_are_and_scaled_match_the_reference() {
    check_dataset(&Backend::Cpu, PBMC, PBMC_DIM, None, 6, 1258);
    check_dataset(&Backend::Cpu, PBMC, PBMC_DIM, Some(1e5), 6, 1258);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pbmc_counts_as_they_are_and_scaled_match_the_reference() {
    assert!(gpu::is_available(), "no CUDA GPU: {}", gpu::describe());
    check_dataset(&Backend::Gpu, PBMC, PBMC_DIM, None, 30, 1258);
    check_dataset(&Backend::Gpu, PBMC, PBMC_DIM, Some(1e5), 30, 1258);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_news20_counts_match_the_reference() {
    assert!(gpu::is_available(), "no CUDA GPU: {}", gpu::describe());
    check_dataset(&Backend::Gpu, NEWS20, NEWS20_DIM, None, 12, 800);
    check_dataset(&Backend::Gpu, NEWS20, NEWS20_DIM, Some(1e5), 12, 800);
}

/// A right side whose rows repeat 12 times: every query has groups of exactly tied neighbours.
fn tied_data() -> (Vec<Row>, SparseBatch, SparseBatch) {
    let base = load(PBMC, None);
    let mut rows: Vec<Row> = Vec::new();
    for r in base.iter().take(100) {
        for _ in 0..12 {
            rows.push(r.clone());
        }
    }
    let right = batch(&rows);
    let left_rows: Vec<Row> = (0..400)
        .map(|i| base[(i * 3) % base.len()].clone())
        .collect();
    let left = batch(&left_rows);
    (rows, right, left)
}

/// Equal distances come in increasing right-row order; runs give the same bits; the backends the
/// same rows.
fn check_ties(backend: &Backend, runs: usize) {
    let (_, right, left) = tied_data();
    for name in [
        "cosine",
        "euclidean",
        "manhattan",
        "jensenshannon",
        "chebyshev",
        "minkowski",
    ] {
        let metric: Metric = Metric::new(
            name,
            Some(3.0).filter(|_| name == "minkowski"),
            Some(PBMC_DIM),
        )
        .unwrap();
        let first = probe(backend, &right, &metric, &left, 20);
        for i in 1..first.len() {
            if first.left[i] == first.left[i - 1] && first.distance[i] == first.distance[i - 1] {
                assert!(
                    first.right[i] > first.right[i - 1],
                    "{name}: tied rows out of order at pair {i}"
                );
            }
        }
        for run in 1..runs {
            let again = probe(backend, &right, &metric, &left, 20);
            assert_eq!(
                first.right, again.right,
                "{name}: run {run} gave other rows"
            );
            let same_bits = first
                .distance
                .iter()
                .zip(&again.distance)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same_bits, "{name}: run {run} gave other distance bits");
        }
        if let Backend::Gpu = backend {
            let cpu = probe(&Backend::Cpu, &right, &metric, &left, 20);
            assert_eq!(
                cpu.right, first.right,
                "{name}: the backends chose other rows"
            );
        }
    }
}

#[test]
fn cpu_ties_are_deterministic_and_in_row_order() {
    check_ties(&Backend::Cpu, 2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_ties_are_deterministic_in_row_order_and_equal_to_the_cpu() {
    assert!(gpu::is_available(), "no CUDA GPU: {}", gpu::describe());
    check_ties(&Backend::Gpu, 3);
}
