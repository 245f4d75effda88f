//! The certified metrics' exact step on the GPU (minkowski, hellinger, jensenshannon,
//! chebyshev): candidates reduced over the union on the device, the pairs sharing no column
//! taken by the kernels from the rows' one-sided sums. On rows where one column is in nearly
//! every row (the shape where the host's step took 10-500x the kernels' time), with raw counts
//! in the thousands, exact copies (ties) and rows sharing no column with many others, the answer
//! is the CPU's row for row, and its distances the CPU's bits wherever the device computes the
//! same terms (every metric here but minkowski at a fractional p, whose `pow` is CUDA's: within
//! 1e-12 there).
//!
//! These need a CUDA GPU: `cargo test --release --test gpu exact:: -- --ignored --test-threads=1`.

use datafusion_sparse_knn::cpu::{self, CpuIndex, PairList, ProbeOptions, Selection};
use datafusion_sparse_knn::gpu::{self, GpuIndex, GpuOptions};
use datafusion_sparse_knn::metric::{Metric, MetricKind};
use datafusion_sparse_knn::SparseBatch;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIM: u64 = 2000;

type Row = Option<Vec<(i32, f32)>>;

/// Column 0 in 95% of the rows, column 1 in 60%, then a few Zipf-like columns; counts up to
/// 5000 beside small counts and fractions; null rows, empty rows, exact copies of earlier rows,
/// rows of one column (many share none with a given left row).
fn heavy_column_rows(rng: &mut StdRng, n: usize) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::with_capacity(n);
    let value = |rng: &mut StdRng| match rng.random_range(0..10) {
        0..=4 => rng.random_range(1..5000) as f32,
        5..=7 => rng.random_range(1..4) as f32,
        _ => rng.random_range(0.01f32..3.0),
    };
    for r in 0..n {
        if r % 97 == 13 {
            rows.push(None);
            continue;
        }
        if r % 89 == 7 {
            rows.push(Some(Vec::new()));
            continue;
        }
        if r % 53 == 5 {
            let copy = rows[r / 2].clone().unwrap_or_default();
            rows.push(Some(copy));
            continue;
        }
        let mut cols = std::collections::BTreeMap::new();
        if r % 11 == 3 {
            // One column away from the popular ones.
            cols.insert(rng.random_range(500..DIM as i32), value(rng));
        } else {
            if rng.random_bool(0.95) {
                cols.insert(0, value(rng));
            }
            if rng.random_bool(0.6) {
                cols.insert(1, value(rng));
            }
            for _ in 0..rng.random_range(0..30) {
                let c = ((DIM as f64).powf(rng.random::<f64>()) - 1.0) as i32;
                cols.insert(c.clamp(2, DIM as i32 - 1), value(rng));
            }
        }
        let mut row: Vec<(i32, f32)> = cols.into_iter().collect();
        if r % 3 == 0 {
            // Unsorted indices are accepted.
            row.reverse();
        }
        rows.push(Some(row));
    }
    rows
}

fn batch(rows: &[Row]) -> SparseBatch {
    SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()))
}

/// Pairs equal row for row; distances equal in bits, or within `rel` of the CPU's.
fn assert_same(label: &str, cpu: &PairList, gpu: &PairList, rel: f64) {
    assert_eq!(cpu.left, gpu.left, "{label}: left rows");
    assert_eq!(cpu.right, gpu.right, "{label}: right rows");
    let mut differ = 0;
    let mut worst = 0.0f64;
    for (c, g) in cpu.distance.iter().zip(&gpu.distance) {
        if c.to_bits() != g.to_bits() {
            differ += 1;
            worst = worst.max((c - g).abs() / c.abs().max(1.0));
        }
    }
    eprintln!(
        "{label}: {differ} of {} distances not the CPU's bits, worst {worst:e}",
        cpu.len()
    );
    if rel == 0.0 {
        assert_eq!(
            differ, 0,
            "{label}: distances differ from the CPU's (worst {worst:e})"
        );
    } else {
        assert!(worst <= rel, "{label}: a distance {worst:e} from the CPU's");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn exact_step_on_the_device_gives_the_cpus_answers_with_a_heavy_column() {
    if !gpu::is_available() {
        eprintln!("no CUDA GPU: {}", gpu::describe());
        return;
    }
    let mut rng = StdRng::seed_from_u64(36);
    let rows = heavy_column_rows(&mut rng, 5000);
    let right = batch(&rows);
    let left = batch(&rows[..800]);
    let metrics: [(MetricKind, Option<f64>, f64); 5] = [
        (MetricKind::Minkowski, Some(3.0), 0.0),
        (MetricKind::Minkowski, Some(2.5), 1e-12),
        (MetricKind::Hellinger, None, 0.0),
        (MetricKind::JensenShannon, None, 0.0),
        (MetricKind::Chebyshev, None, 0.0),
    ];
    for (kind, p, rel) in metrics {
        let m = Metric::from_kind(kind, p, Some(DIM)).unwrap();
        let cpu_index = CpuIndex::build(&right, &m);
        let on_device = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
        assert!(
            on_device.exact_on_device(),
            "{m}: the exact step stays on the host"
        );
        std::env::set_var("SPARSE_KNN_GPU_EXACT", "host");
        let on_host = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
        std::env::remove_var("SPARSE_KNN_GPU_EXACT");
        assert!(!on_host.exact_on_device(), "{m}: SPARSE_KNN_GPU_EXACT=host");
        let radius = super::median_knn_distance(&cpu_index, &left, 10);
        for sel in [
            Selection::Nearest(1),
            Selection::Nearest(10),
            Selection::Nearest(40),
            Selection::Within(radius),
        ] {
            for exclude in [None, Some(0i64)] {
                let po = ProbeOptions {
                    exclude_self_from: exclude,
                };
                let label = format!("{m} {sel:?} exclude={exclude:?}");
                let c = cpu::probe(&cpu_index, &left, sel, po);
                let started = std::time::Instant::now();
                let g = on_device.probe(&left, sel, po).unwrap();
                let device_s = started.elapsed().as_secs_f64();
                let started = std::time::Instant::now();
                let h = on_host.probe(&left, sel, po).unwrap();
                let host_s = started.elapsed().as_secs_f64();
                eprintln!("{label}: exact step on the device {device_s:.3} s, host {host_s:.3} s");
                assert!(c.len() >= left.len() / 2, "{label}: {} pairs", c.len());
                // Ties in the answers (exact copies): kept in right-row order.
                for i in 1..g.len() {
                    if g.left[i] == g.left[i - 1] && g.distance[i] == g.distance[i - 1] {
                        assert!(
                            g.right[i] > g.right[i - 1],
                            "{label}: tie out of order at {i}"
                        );
                    }
                }
                assert_same(&format!("{label} device"), &c, &g, rel);
                assert_same(&format!("{label} host"), &c, &h, rel);
            }
        }
    }
}
