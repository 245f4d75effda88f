//! The GPU backend against the CPU backend, for every metric, on random data shaped to reach the
//! kernels' corners: skewed degrees, popular columns, more right rows than one tile, rows of
//! degree above 10K, empty and null rows, k larger than the right side, ties, exclude_self,
//! radius, and a memory limit small enough to cut the right side into parts.
//!
//! These need a CUDA GPU: `cargo test --release --test gpu -- --ignored --test-threads=1`.

/// The certified metrics' exact step on the device (a module of this binary: one link less).
#[path = "gpu/exact.rs"]
mod exact;

/// Few left rows against many tiles: the tiles cut into groups (a module of this binary).
#[path = "gpu/tile_groups.rs"]
mod tile_groups;

use arrow::buffer::NullBuffer;
use datafusion_sparse_knn::cpu::{self, CpuIndex, PairList, ProbeOptions, Selection};
use datafusion_sparse_knn::gpu::{self, GpuIndex, GpuOptions};
use datafusion_sparse_knn::metric::{Metric, MetricKind};
use datafusion_sparse_knn::options::DenseColumnChoice;
use datafusion_sparse_knn::SparseBatch;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIM: u64 = 3000;

/// Rows with power-law degrees and Zipf-like columns; some empty, some null, some duplicated
/// (exact ties), values positive (the metrics that need x ≥ 0 accept them all).
fn random_rows(
    rng: &mut StdRng,
    n: usize,
    dim: u64,
    max_deg: usize,
    big_rows: &[usize],
) -> Vec<Option<Vec<(i32, f32)>>> {
    let mut rows: Vec<Option<Vec<(i32, f32)>>> = Vec::with_capacity(n);
    for r in 0..n {
        if r % 97 == 13 {
            rows.push(None);
            continue;
        }
        if r % 89 == 7 {
            rows.push(Some(Vec::new()));
            continue;
        }
        if r % 53 == 5 && r > 0 {
            // An exact copy of an earlier row: ties at every metric.
            let copy = rows[r / 2].clone().unwrap_or_default();
            rows.push(Some(copy));
            continue;
        }
        let u: f64 = rng.random::<f64>().max(1e-9);
        let mut deg = ((1.0 / u.powf(1.0 / 1.3)) as usize).min(max_deg);
        if big_rows.contains(&r) {
            deg = (dim as usize) * 4 / 5;
        }
        let mut cols = std::collections::BTreeMap::new();
        if deg > 10_000 {
            // Rows of very high degree: every few columns (Zipf sampling would take forever).
            let step = dim as usize / deg;
            for i in 0..deg {
                cols.insert((i * step) as i32, rng.random_range(0.01f32..3.0));
            }
        }
        while cols.len() < deg {
            // Zipf-ish: low column ids are popular.
            let z: f64 = rng.random::<f64>();
            let c = ((dim as f64).powf(z) - 1.0) as i32;
            let v = if rng.random_bool(0.2) {
                (rng.random_range(1..4)) as f32
            } else {
                rng.random_range(0.01f32..3.0)
            };
            cols.insert(c.min(dim as i32 - 1), v);
        }
        let mut v: Vec<(i32, f32)> = cols.into_iter().collect();
        // Unsorted indices are accepted: shuffle some rows.
        if r % 3 == 0 {
            v.reverse();
        }
        rows.push(Some(v));
    }
    rows
}

fn batch(rows: &[Option<Vec<(i32, f32)>>]) -> SparseBatch {
    SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()))
}

fn metric(kind: MetricKind, dim: u64) -> Metric {
    let p = if kind == MetricKind::Minkowski {
        Some(3.0)
    } else {
        None
    };
    Metric::from_kind(kind, p, Some(dim)).unwrap()
}

fn tolerance(reference: f64, scale: f64) -> f64 {
    // SPEC: 1e-4 · max(1, |ref|); the expanded forms may cancel: 1e-3 · √(‖x‖² + ‖y‖²).
    (1e-4 * reference.abs().max(1.0)).max(1e-3 * scale)
}

fn norm2(row: (&[i32], &[f32])) -> f64 {
    row.1.iter().map(|&v| (v as f64) * (v as f64)).sum()
}

/// GPU pairs agree with the CPU: same count per left row, distances equal within tolerance rank
/// by rank, and every GPU pair's distance is the true distance of that pair (so ties or
/// near-ties may pick different rows, but never a wrong one).
fn compare(
    name: &str,
    m: &Metric,
    left: &SparseBatch,
    right: &SparseBatch,
    cpu: &PairList,
    gpu: &PairList,
) {
    let per_row = |p: &PairList, n: usize| {
        let mut v = vec![Vec::new(); n];
        for i in 0..p.len() {
            v[p.left[i] as usize].push((p.right[i], p.distance[i]));
        }
        v
    };
    let c = per_row(cpu, left.len());
    let g = per_row(gpu, left.len());
    // The GPU list must be ordered by left row.
    assert!(
        gpu.left.windows(2).all(|w| w[0] <= w[1]),
        "{name}: GPU pairs not ordered by left row"
    );
    for i in 0..left.len() {
        assert_eq!(
            c[i].len(),
            g[i].len(),
            "{name}: left row {i}: {} CPU pairs, {} GPU pairs",
            c[i].len(),
            g[i].len()
        );
        let li = left.row(i);
        for (rank, (cp, gp)) in c[i].iter().zip(&g[i]).enumerate() {
            let rj = right.row(gp.0 as usize);
            let scale = if matches!(
                m.kind,
                MetricKind::Euclidean | MetricKind::SqEuclidean | MetricKind::Correlation
            ) {
                (norm2(li) + norm2(rj)).sqrt()
            } else {
                0.0
            };
            let tol = tolerance(cp.1, scale);
            let close = (cp.1 == gp.1) || (cp.1 - gp.1).abs() <= tol;
            assert!(
                close,
                "{name}: left row {i} rank {rank}: CPU ({}, {}) GPU ({}, {}), tol {tol}",
                cp.0, cp.1, gp.0, gp.1
            );
            let truth = m.distance(li, rj);
            let ok = truth == gp.1 || (truth - gp.1).abs() <= tolerance(truth, scale);
            assert!(ok, "{name}: left row {i}: GPU pair ({i}, {}) distance {} but the pair's distance is {truth}", gp.0, gp.1);
        }
        // Within one left row the right rows are distinct.
        let mut rows: Vec<u32> = g[i].iter().map(|p| p.0).collect();
        rows.sort_unstable();
        rows.dedup();
        assert_eq!(
            rows.len(),
            g[i].len(),
            "{name}: left row {i}: a right row twice"
        );
    }
}

/// A radius join's pairs agree with the CPU's: every pair found by both within `tol(pair, d)`,
/// and a pair found by one side only lies at the radius (within the same tolerance).
fn assert_same_radius_pairs(
    name: &str,
    cpu: &PairList,
    gpu: &PairList,
    radius: f64,
    tol: impl Fn(u64, f64) -> f64,
) {
    let key = |p: &PairList, i: usize| ((p.left[i] as u64) << 32) | p.right[i] as u64;
    let cset: std::collections::HashMap<u64, f64> = (0..cpu.len())
        .map(|i| (key(cpu, i), cpu.distance[i]))
        .collect();
    let gset: std::collections::HashMap<u64, f64> = (0..gpu.len())
        .map(|i| (key(gpu, i), gpu.distance[i]))
        .collect();
    for (&kk, &d) in &cset {
        if !gset.contains_key(&kk) {
            assert!(
                (d - radius).abs() <= tol(kk, radius),
                "{name}: CPU pair {kk:x} at {d} missing on the GPU (radius {radius})"
            );
        }
    }
    for (&kk, &d) in &gset {
        match cset.get(&kk) {
            Some(&cd) => assert!(
                (cd - d).abs() <= tol(kk, cd),
                "{name}: pair {kk:x}: CPU {cd} GPU {d}"
            ),
            None => assert!(
                (d - radius).abs() <= tol(kk, radius),
                "{name}: GPU pair {kk:x} at {d} not on the CPU (radius {radius})"
            ),
        }
    }
}

fn gpu_or_skip() -> bool {
    if !gpu::is_available() {
        eprintln!("no CUDA GPU: {}", gpu::describe());
        return false;
    }
    true
}

fn check_all_metrics(
    seed: u64,
    n_left: usize,
    n_right: usize,
    max_deg: usize,
    k: usize,
    options: GpuOptions,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let right_rows = random_rows(&mut rng, n_right, DIM, max_deg, &[]);
    let left_rows: Vec<_> = right_rows.iter().take(n_left).cloned().collect();
    let right = batch(&right_rows);
    let left = batch(&left_rows);
    for kind in MetricKind::all() {
        let m = metric(kind, DIM);
        let cpu_index = CpuIndex::build(&right, &m);
        let gpu_index =
            GpuIndex::build(&right, &m, &options).unwrap_or_else(|e| panic!("{kind}: build: {e}"));
        for (sel, label) in [(Selection::Nearest(k), "knn")] {
            for exclude in [None, Some(0i64)] {
                let po = ProbeOptions {
                    exclude_self_from: exclude,
                };
                let c = cpu::probe(&cpu_index, &left, sel, po);
                let g = gpu_index
                    .probe(&left, sel, po)
                    .unwrap_or_else(|e| panic!("{kind}: probe: {e}"));
                compare(
                    &format!("{kind} {label} exclude={exclude:?}"),
                    &m,
                    &left,
                    &right,
                    &c,
                    &g,
                );
            }
        }
        let stats = gpu_index.stats();
        assert!(
            stats.bytes_to_device > 0 && stats.kernel_nanos > 0,
            "{kind}: stats {stats:?}"
        );
        if let Some(limit) = options.memory_limit {
            // (the union metrics keep the right side as compact rows, small enough to stay
            // whole here)
            let union = matches!(
                kind,
                MetricKind::Chebyshev
                    | MetricKind::Minkowski
                    | MetricKind::Hellinger
                    | MetricKind::JensenShannon
            );
            assert!(
                union || gpu_index.parts() > 1,
                "{kind}: the memory limit should cut the right side"
            );
            assert!(
                stats.peak_device_bytes <= limit,
                "{kind}: peak {} over the limit {limit}",
                stats.peak_device_bytes
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_metric_matches_cpu_small() {
    if !gpu_or_skip() {
        return;
    }
    check_all_metrics(1, 300, 1200, 300, 10, GpuOptions::default());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_metric_matches_cpu_many_tiles() {
    if !gpu_or_skip() {
        return;
    }
    // Small tiles so the tile boundaries and the candidate compaction across tiles are crossed.
    std::env::set_var("SPARSE_KNN_GPU_TILE_ROWS", "256");
    check_all_metrics(2, 200, 3000, 500, 7, GpuOptions::default());
    std::env::remove_var("SPARSE_KNN_GPU_TILE_ROWS");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_metric_matches_cpu_with_the_segment_map_everywhere() {
    if !gpu_or_skip() {
        return;
    }
    // The kernels find each work item's segment in a block-wide map for chunks of many items
    // over many segments, by a binary search otherwise; here every chunk takes the map (windows
    // cut short, one segment, empty segments), small tiles so chunks cross tile boundaries.
    std::env::set_var("SPARSE_KNN_GPU_SEG_MAP", "always");
    std::env::set_var("SPARSE_KNN_GPU_TILE_ROWS", "256");
    check_all_metrics(5, 200, 3000, 700, 7, GpuOptions::default());
    std::env::remove_var("SPARSE_KNN_GPU_TILE_ROWS");
    std::env::remove_var("SPARSE_KNN_GPU_SEG_MAP");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_metric_matches_cpu_under_memory_limit() {
    if !gpu_or_skip() {
        return;
    }
    // 250 KB: the right side goes in several parts, streamed per probe.
    check_all_metrics(
        3,
        150,
        4000,
        200,
        5,
        GpuOptions {
            memory_limit: Some(250_000),
            ..GpuOptions::default()
        },
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn large_k_ties_and_huge_rows() {
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(4);
    let dim = 20_000u64;
    // Two rows of degree 16K (above 10K) on each side, and k above the right side's size.
    let right_rows = random_rows(&mut rng, 700, dim, 2000, &[3, 400]);
    let left_rows: Vec<_> = right_rows.iter().take(120).cloned().collect();
    let right = batch(&right_rows);
    let left = batch(&left_rows);
    for kind in MetricKind::all() {
        let m = metric(kind, dim);
        let cpu_index = CpuIndex::build(&right, &m);
        let gpu_index = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
        for k in [1usize, 64, 1000] {
            let po = ProbeOptions {
                exclude_self_from: Some(0),
            };
            let c = cpu::probe(&cpu_index, &left, Selection::Nearest(k), po);
            let g = gpu_index.probe(&left, Selection::Nearest(k), po).unwrap();
            compare(&format!("{kind} k={k}"), &m, &left, &right, &c, &g);
        }
        // k above the device limit falls back to the CPU backend: same answer.
        let c = cpu::probe(
            &cpu_index,
            &left,
            Selection::Nearest(2000),
            ProbeOptions::default(),
        );
        let g = gpu_index
            .probe(&left, Selection::Nearest(2000), ProbeOptions::default())
            .unwrap();
        compare(&format!("{kind} k=2000"), &m, &left, &right, &c, &g);
    }
}

/// Radius joins: the same set of pairs (up to pairs on the boundary), ordered by left then right.
#[test]
#[ignore = "needs a CUDA GPU"]
fn radius_matches_cpu() {
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(5);
    let right_rows = random_rows(&mut rng, 1500, DIM, 300, &[]);
    let left_rows: Vec<_> = right_rows.iter().take(200).cloned().collect();
    let right = batch(&right_rows);
    let left = batch(&left_rows);
    for (limit, tiles) in [(None, None), (Some(200_000u64), Some("128"))] {
        if let Some(t) = tiles {
            std::env::set_var("SPARSE_KNN_GPU_TILE_ROWS", t);
        }
        for kind in MetricKind::all() {
            let m = metric(kind, DIM);
            let cpu_index = CpuIndex::build(&right, &m);
            let gpu_index = GpuIndex::build(
                &right,
                &m,
                &GpuOptions {
                    memory_limit: limit,
                    ..GpuOptions::default()
                },
            )
            .unwrap();
            // A radius that keeps about 5% of the pairs: the CPU's 20th-nearest of a few rows.
            let probe_k = cpu::probe(
                &cpu_index,
                &left,
                Selection::Nearest(75),
                ProbeOptions::default(),
            );
            let mut ds: Vec<f64> = probe_k
                .distance
                .iter()
                .copied()
                .filter(|d| d.is_finite())
                .collect();
            ds.sort_by(|a, b| a.total_cmp(b));
            let radius = if ds.is_empty() {
                0.5
            } else if kind.is_similarity() {
                ds[ds.len() * 3 / 4]
            } else {
                ds[ds.len() / 4]
            };
            let po = ProbeOptions {
                exclude_self_from: Some(0),
            };
            let c = cpu::probe(&cpu_index, &left, Selection::Within(radius), po);
            let g = gpu_index
                .probe(&left, Selection::Within(radius), po)
                .unwrap();
            assert!(g.left.windows(2).all(|w| w[0] <= w[1]));
            for w in 0..g.len().saturating_sub(1) {
                if g.left[w] == g.left[w + 1] {
                    assert!(
                        g.right[w] < g.right[w + 1],
                        "{kind}: radius pairs not ordered by right row"
                    );
                }
            }
            assert_same_radius_pairs(&format!("{kind}"), &c, &g, radius, |_, d| tolerance(d, 1.0));
            if let Some(l) = limit {
                assert!(gpu_index.stats().peak_device_bytes <= l);
            }
        }
        std::env::remove_var("SPARSE_KNN_GPU_TILE_ROWS");
    }
}

/// A radius that keeps every pair overflows the first pair buffer: the second pass gets them all.
#[test]
#[ignore = "needs a CUDA GPU"]
fn radius_overflow_second_pass() {
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(6);
    let right_rows = random_rows(&mut rng, 3000, DIM, 50, &[]);
    let left_rows: Vec<_> = right_rows.iter().take(2000).cloned().collect();
    let right = batch(&right_rows);
    let left = batch(&left_rows);
    let m = metric(MetricKind::Jaccard, DIM);
    let gpu_index = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
    let g = gpu_index
        .probe(&left, Selection::Within(1.0), ProbeOptions::default())
        .unwrap();
    let valid_left = (0..left.len()).filter(|&i| !left.is_null(i)).count();
    let valid_right = (0..right.len()).filter(|&i| !right.is_null(i)).count();
    assert_eq!(g.len(), valid_left * valid_right);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn concurrent_probes_share_one_index() {
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(7);
    let right_rows = random_rows(&mut rng, 2000, DIM, 200, &[]);
    let right = batch(&right_rows);
    let m = metric(MetricKind::Cosine, DIM);
    let index = std::sync::Arc::new(GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap());
    let expected = index
        .probe(&right, Selection::Nearest(5), ProbeOptions::default())
        .unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let index = index.clone();
            let right = right.clone();
            std::thread::spawn(move || {
                index
                    .probe(&right, Selection::Nearest(5), ProbeOptions::default())
                    .unwrap()
            })
        })
        .collect();
    for h in handles {
        // Float atomics add in any order: the same pairs, distances equal up to rounding.
        let got = h.join().unwrap();
        compare("cosine concurrent", &m, &right, &right, &expected, &got);
    }
}

/// `gpu::close_unused` (what `knn` calls while its output is written) leaves a device that an
/// index still holds open, closes it once nothing does, and the next build opens it again (a new
/// context, the module loaded again) with the same answers as the CPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn closed_gpus_reopen_for_the_next_join() {
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(19);
    let right = batch(&random_rows(&mut rng, 1500, DIM, 120, &[]));
    let left = batch(&random_rows(&mut rng, 200, DIM, 120, &[]));
    let m = metric(MetricKind::Cosine, DIM);
    let expected = cpu::probe(
        &CpuIndex::build(&right, &m),
        &left,
        Selection::Nearest(7),
        ProbeOptions::default(),
    );
    let index = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
    let before = gpu::close_unused();
    let got = index
        .probe(&left, Selection::Nearest(7), ProbeOptions::default())
        .unwrap();
    compare(
        "cosine, index held across close_unused",
        &m,
        &left,
        &right,
        &expected,
        &got,
    );
    drop(index);
    let closed = gpu::close_unused();
    assert!(
        closed >= 1,
        "no device closed once the index was dropped (closed {before} while it was held)"
    );
    assert_eq!(gpu::close_unused(), 0, "a closed device was closed again");
    let reopened = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
    let got = reopened
        .probe(&left, Selection::Nearest(7), ProbeOptions::default())
        .unwrap();
    compare(
        "cosine, after the device was reopened",
        &m,
        &left,
        &right,
        &expected,
        &got,
    );
}

/// A cancelled probe stops between launches: set before the probe, no row is probed; set once
/// the first launch is done, the rest of the left side is never launched.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cancelled_probe_stops_between_launches() {
    use datafusion_sparse_knn::join::{Cancel, JoinIndex};
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(12);
    let right = batch(&random_rows(&mut rng, 3000, DIM, 100, &[]));
    let left = batch(&random_rows(&mut rng, 200_000, DIM, 60, &[]));
    let m = metric(MetricKind::Cosine, DIM);
    // A small budget: the left side goes up in many launches.
    let options = GpuOptions {
        memory_limit: Some(8_000_000),
        ..GpuOptions::default()
    };
    let index = GpuIndex::build(&right, &m, &options).unwrap();

    let cancelled = Cancel::new();
    cancelled.cancel();
    let e = index
        .probe_cancellable(
            &left,
            Selection::Nearest(5),
            ProbeOptions::default(),
            &cancelled,
        )
        .unwrap_err();
    assert!(e.to_string().contains("cancelled"), "{e}");
    assert_eq!(cancelled.rows_probed(), 0);

    let cancel = Cancel::new();
    let watcher = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            while cancel.rows_probed() == 0 {
                std::thread::yield_now();
            }
            cancel.cancel();
        })
    };
    let result = index.probe_cancellable(
        &left,
        Selection::Nearest(5),
        ProbeOptions::default(),
        &cancel,
    );
    watcher.join().unwrap();
    assert!(result.is_err());
    let probed = cancel.rows_probed();
    assert!(
        probed < left.len() as u64 / 2,
        "{probed} of {} rows probed",
        left.len()
    );
    eprintln!("cancelled after {probed} of {} left rows", left.len());
}

/// Every visible GPU through the backend's own build: the right side (given in three pieces)
/// whole on each GPU, and, under a memory limit that keeps it from staying on one, sharded over
/// them; both agree with the CPU, and each GPU's kernel time is reported (whole on each, over
/// as many probes as there are GPUs). On a one-GPU machine
/// both run on that GPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_gpu_of_the_host_matches_cpu_replicated_and_sharded() {
    use datafusion_sparse_knn::gpu::GpuBackend;
    use datafusion_sparse_knn::join::Backend;
    if !gpu_or_skip() {
        return;
    }
    let gpus = GpuBackend::default().ordinals().unwrap().len();
    let mut rng = StdRng::seed_from_u64(21);
    let right_rows = random_rows(&mut rng, 4000, DIM, 200, &[]);
    let left_rows: Vec<_> = right_rows.iter().skip(500).take(200).cloned().collect();
    let right = batch(&right_rows);
    let left = batch(&left_rows);
    let pieces = vec![
        right.slice(0, 1000),
        right.slice(1000, 2500),
        right.slice(3500, 500),
    ];
    for kind in [
        MetricKind::Cosine,
        MetricKind::Manhattan,
        MetricKind::Chebyshev,
        MetricKind::JensenShannon,
    ] {
        let m = metric(kind, DIM);
        let cpu_index = CpuIndex::build(&right, &m);
        // 100 KB: the right side cannot stay whole on each GPU (its accumulators and column
        // offsets alone pass 60% of it), so it is sharded. At 400 KB it fitted whole for some
        // metrics and was replicated, which the first run on two GPUs showed.
        for memory_limit in [None, Some(100_000)] {
            let backend = GpuBackend {
                options: GpuOptions {
                    memory_limit,
                    ..GpuOptions::default()
                },
            };
            let index = backend.build_pieces(pieces.clone(), &m).unwrap();
            let po = ProbeOptions {
                exclude_self_from: Some(500),
            };
            let sel = Selection::Nearest(6);
            let c = cpu::probe(&cpu_index, &left, sel, po);
            let g = index.probe(&left, sel, po).unwrap();
            let label = format!("{kind} on {gpus} GPU(s), memory_limit={memory_limit:?}");
            compare(
                &label,
                &m,
                &left,
                &right,
                &c,
                &PairList::concat(g.parts.clone()),
            );
            let mut used: Vec<usize> = g.gpu_times.iter().map(|(o, _)| *o).collect();
            // Whole on each GPU, a probe this small goes whole to one GPU, the next to the next.
            for _ in 1..gpus {
                let again = index.probe(&left, sel, po).unwrap();
                assert_eq!(
                    PairList::concat(again.parts),
                    PairList::concat(g.parts.clone())
                );
                used.extend(again.gpu_times.iter().map(|(o, _)| *o));
            }
            used.sort_unstable();
            used.dedup();
            assert_eq!(used, (0..gpus).collect::<Vec<_>>(), "{label}");
            // Whole on each GPU: one index a GPU; sharded: the right side cut over the GPUs.
            if gpus > 1 && memory_limit.is_some() {
                assert!(index.shards() >= gpus, "{label}: {} shards", index.shards());
            } else {
                assert_eq!(index.shards(), 1, "{label}");
            }
        }
    }
}

/// The right side whole on each of several GPUs, with the one GPU of a small machine named
/// several times: prepared once, uploaded to each, a probe's left rows split between them, or
/// probes at once each whole on one; the pairs are those of one index.
#[test]
#[ignore = "needs a CUDA GPU"]
fn replicas_split_the_left_rows_and_match_one_index() {
    use datafusion_sparse_knn::gpu::GpuBackend;
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(22);
    let right = batch(&random_rows(&mut rng, 3000, DIM, 300, &[]));
    let left = right.slice(100, 1700);
    for kind in [
        MetricKind::Cosine,
        MetricKind::Hellinger,
        MetricKind::Minkowski,
    ] {
        let m = metric(kind, DIM);
        let single = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
        let replicated = GpuBackend::default()
            .replicated_for_tests(&[0, 0, 0], &right, &m, 64)
            .unwrap();
        // Each replica uploads what one index does (read before any probe adds to it).
        assert_eq!(
            replicated.build_bytes_to_device(),
            3 * single.stats().bytes_to_device
        );
        for sel in [Selection::Nearest(7), Selection::Nearest(1500)] {
            let po = ProbeOptions {
                exclude_self_from: Some(100),
            };
            let want = single.probe(&left, sel, po).unwrap();
            let got = replicated.probe(&left, sel, po).unwrap();
            let got_pairs = PairList::concat(got.parts.clone());
            compare(
                &format!("{kind} {sel:?} replicated"),
                &m,
                &left,
                &right,
                &want,
                &got_pairs,
            );
            assert_eq!(got_pairs.len(), want.len(), "{kind} {sel:?}");
            assert!(got.bytes_to_device > 0);
            // Four probes at once: the first cut between the idle replicas, the others whole
            // on the least loaded.
            let pieces: Vec<SparseBatch> = (0..4).map(|i| left.slice(i * 400, 500)).collect();
            let at_once: Vec<PairList> = std::thread::scope(|scope| {
                let handles: Vec<_> = pieces
                    .iter()
                    .enumerate()
                    .map(|(i, piece)| {
                        let replicated = &replicated;
                        scope.spawn(move || {
                            let po = ProbeOptions {
                                exclude_self_from: Some(100 + 400 * i as i64),
                            };
                            PairList::concat(replicated.probe(piece, sel, po).unwrap().parts)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (i, (piece, got)) in pieces.iter().zip(&at_once).enumerate() {
                let po = ProbeOptions {
                    exclude_self_from: Some(100 + 400 * i as i64),
                };
                let want = single.probe(piece, sel, po).unwrap();
                let label = format!("{kind} {sel:?} piece {i} at once");
                compare(&label, &m, piece, &right, &want, got);
                assert_eq!(got.len(), want.len(), "{label}");
            }
        }
    }
}

/// The certified metrics leave the pairs that share no column to the host (found from the rows'
/// one-sided sums); chebyshev's max comes from the inverted lists with bounds, exact but where
/// a row's 32 largest entries are all shared (near copies below). On rows like ratings (mostly one to three columns, counts in the thousands
/// beside small ones, so thousands of rows share no column with a left row and tie exactly) the
/// GPU's answer is the CPU's, row for row and bit for bit: knn below and above the device's k,
/// radius joins, exclude_self, null and empty rows, one part or several.
#[test]
#[ignore = "needs a CUDA GPU"]
fn certified_metrics_take_rows_sharing_no_column_exactly() {
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(11);
    let mut rows: Vec<Option<Vec<(i32, f32)>>> = (0..6000)
        .map(|r| {
            if r % 211 == 3 {
                return None;
            }
            let len = match rng.random_range(0..10) {
                0..=5 => rng.random_range(0..3),
                6..=8 => rng.random_range(3..30),
                _ => rng.random_range(30..400),
            };
            let mut cols: Vec<i32> = (0..len)
                .map(|_| (800f64.powf(rng.random::<f64>()) - 1.0) as i32)
                .collect();
            cols.sort_unstable();
            cols.dedup();
            Some(
                cols.into_iter()
                    .map(|c| (c, [1.0f32, 2.0, 5.0, 3000.0][rng.random_range(0..4)]))
                    .collect(),
            )
        })
        .collect();
    // Near copies of long rows (one value changed): every one of their largest entries is
    // shared, where a max's bounds are not exact.
    for r in (100..6000).step_by(50) {
        if let Some(mut copy) = rows[r - 37].clone().filter(|row| row.len() > 40) {
            copy[3].1 += 1.0;
            rows[r] = Some(copy);
        }
    }
    let right = batch(&rows);
    let left = batch(&rows[..700]);
    for kind in [
        MetricKind::Minkowski,
        MetricKind::Hellinger,
        MetricKind::JensenShannon,
        MetricKind::Chebyshev,
    ] {
        let m = metric(kind, 800);
        let cpu_index = CpuIndex::build(&right, &m);
        for limit in [None, Some(2_500_000u64)] {
            let gpu_index = GpuIndex::build(
                &right,
                &m,
                &GpuOptions {
                    memory_limit: limit,
                    ..GpuOptions::default()
                },
            )
            .unwrap();
            eprintln!("{kind} limit={limit:?}: {} parts", gpu_index.parts());
            let radius = median_knn_distance(&cpu_index, &left, 40);
            for sel in [
                Selection::Nearest(1),
                Selection::Nearest(10),
                Selection::Nearest(1500),
                Selection::Within(radius),
            ] {
                for exclude in [None, Some(0i64)] {
                    let po = ProbeOptions {
                        exclude_self_from: exclude,
                    };
                    let started = std::time::Instant::now();
                    let c = cpu::probe(&cpu_index, &left, sel, po);
                    let cpu_s = started.elapsed().as_secs_f64();
                    let g = gpu_index.probe(&left, sel, po).unwrap();
                    let label = format!("{kind} {sel:?} exclude={exclude:?} limit={limit:?}");
                    eprintln!(
                        "{label}: {} pairs, CPU {cpu_s:.2} s, GPU {:.2} s",
                        c.len(),
                        started.elapsed().as_secs_f64() - cpu_s
                    );
                    assert!(c.len() > left.len() / 2, "{label}: {} pairs", c.len());
                    assert_eq!(c.left, g.left, "{label}: left rows");
                    assert_eq!(c.right, g.right, "{label}: right rows");
                    assert_eq!(c.distance, g.distance, "{label}: distances");
                }
            }
        }
    }
}

/// Rows whose first `dense` columns are nonzero in 20-90% of the rows (the rest Zipf-sparse), with
/// `values` drawn by the caller: raw counts or fractions. Nulls, empty rows and exact copies as
/// in `random_rows`.
fn rows_with_dense_columns(
    rng: &mut StdRng,
    n: usize,
    dense: usize,
    mut value: impl FnMut(&mut StdRng) -> f32,
) -> Vec<Option<Vec<(i32, f32)>>> {
    let mut rows: Vec<Option<Vec<(i32, f32)>>> = Vec::with_capacity(n);
    for r in 0..n {
        if r % 97 == 13 {
            rows.push(None);
        } else if r % 89 == 7 {
            rows.push(Some(Vec::new()));
        } else if r % 53 == 5 {
            rows.push(rows[r / 2].clone().or(Some(Vec::new())));
        } else {
            let mut row = Vec::new();
            for c in 0..dense {
                if rng.random_bool(0.9 - 0.7 * c as f64 / dense as f64) {
                    row.push((c as i32, value(rng)));
                }
            }
            let mut sparse = std::collections::BTreeSet::new();
            for _ in 0..rng.random_range(0..60) {
                let z: f64 = rng.random::<f64>();
                sparse.insert(dense as i32 + ((DIM - dense as u64) as f64).powf(z) as i32 - 1);
            }
            row.extend(sparse.into_iter().map(|c| (c, value(rng))));
            if r % 3 == 0 {
                row.reverse();
            }
            rows.push(Some(row));
        }
    }
    rows
}

/// dot and cosine with their densest columns multiplied on the tensor cores (the 8-bit product for
/// counts up to 127, the half-precision one for counts up to 2048, one TF32 product for TF32
/// numbers, the split 3xTF32 product for other counts and for fractions)
/// give the CPU's answers: knn with and without exclude_self, k above the kernels' top-k, radius, a left
/// chunk with a value outside the product's range (run without it), shapes that are not
/// multiples of the product's tiles.
#[test]
#[ignore = "needs a CUDA GPU"]
fn dense_columns_on_tensor_cores_match_cpu() {
    if !gpu_or_skip() {
        return;
    }
    type Draw = fn(&mut StdRng) -> f32;
    let draws: [(&str, Draw); 5] = [
        ("counts below 128", |rng| rng.random_range(1..128) as f32),
        ("counts below 2^11", |rng| rng.random_range(1..2048) as f32),
        ("even counts to 8000 (TF32 numbers)", |rng| {
            (rng.random_range(1..2000) * 4) as f32
        }),
        ("counts to 5000", |rng| {
            (1.0 / rng.random::<f64>().max(2e-4)).min(5000.0).round() as f32
        }),
        ("fractions", |rng| rng.random_range(0.001f32..3.0)),
    ];
    for (seed, (label, draw)) in draws.into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(100 + seed as u64);
        let right_rows = rows_with_dense_columns(&mut rng, 2999, 200, draw);
        let right = batch(&right_rows);
        let left = batch(&right_rows[..413]);
        // One left row with a value beyond 2^40 in a dense column.
        let mut far_rows = right_rows[..413].to_vec();
        far_rows[20] = Some(vec![(0, 2.0e12), (1, 3.0), (500, 1.0)]);
        let far = batch(&far_rows);
        // The expanded forms cancel near zero, beyond float32 products: they keep the lists.
        for kind in [
            MetricKind::Euclidean,
            MetricKind::SqEuclidean,
            MetricKind::Correlation,
        ] {
            let options = GpuOptions {
                dense_columns: DenseColumnChoice::MinShare(0.15),
                ..GpuOptions::default()
            };
            let index = GpuIndex::build(&right, &metric(kind, DIM), &options).unwrap();
            assert_eq!(index.dense_columns(), 0, "{kind}");
        }
        for kind in [MetricKind::Dot, MetricKind::Cosine] {
            let m = metric(kind, DIM);
            let cpu_index = CpuIndex::build(&right, &m);
            let options = GpuOptions {
                dense_columns: DenseColumnChoice::MinShare(0.15),
                ..GpuOptions::default()
            };
            let gpu_index = GpuIndex::build(&right, &m, &options).unwrap();
            assert!(
                gpu_index.dense_columns() >= 100,
                "{label} {kind}: {} dense columns",
                gpu_index.dense_columns()
            );
            let off = GpuIndex::build(
                &right,
                &m,
                &GpuOptions {
                    dense_columns: DenseColumnChoice::Off,
                    ..GpuOptions::default()
                },
            )
            .unwrap();
            assert_eq!(off.dense_columns(), 0);
            // A budget that keeps the right side and its block whole but cuts each probe into
            // several launches.
            let tight = GpuIndex::build(
                &right,
                &m,
                &GpuOptions {
                    dense_columns: DenseColumnChoice::MinShare(0.45),
                    memory_limit: Some(16 << 20),
                    ..GpuOptions::default()
                },
            )
            .unwrap();
            assert!(
                tight.dense_columns() > 0 && tight.parts() == 1,
                "{label} {kind}"
            );
            for (sel, exclude) in [
                (Selection::Nearest(10), None),
                (Selection::Nearest(10), Some(0i64)),
                (Selection::Nearest(1500), Some(0i64)),
            ] {
                let po = ProbeOptions {
                    exclude_self_from: exclude,
                };
                for (which, l) in [("left", &left), ("far left", &far)] {
                    let c = cpu::probe(&cpu_index, l, sel, po);
                    let name = format!("{label} {kind} {which} {sel:?} exclude={exclude:?}");
                    compare(
                        &name,
                        &m,
                        l,
                        &right,
                        &c,
                        &gpu_index.probe(l, sel, po).unwrap(),
                    );
                    compare(&name, &m, l, &right, &c, &off.probe(l, sel, po).unwrap());
                    let name = format!("{name} in several launches");
                    compare(&name, &m, l, &right, &c, &tight.probe(l, sel, po).unwrap());
                }
            }
            // Radius: the 10th nearest distance of the CPU's answers, median over rows.
            let tenth = cpu::probe(
                &cpu_index,
                &left,
                Selection::Nearest(10),
                ProbeOptions::default(),
            );
            let mut ds: Vec<f64> = tenth
                .distance
                .iter()
                .copied()
                .filter(|d| d.is_finite())
                .collect();
            ds.sort_by(|a, b| a.total_cmp(b));
            let radius = ds[ds.len() / 2];
            let po = ProbeOptions::default();
            let c = cpu::probe(&cpu_index, &left, Selection::Within(radius), po);
            let g = gpu_index
                .probe(&left, Selection::Within(radius), po)
                .unwrap();
            assert!(c.len() > 1000, "{label} {kind}: {} radius pairs", c.len());
            assert_same_radius_pairs(&format!("{label} {kind}"), &c, &g, radius, |_, d| {
                tolerance(d, 0.0)
            });
        }
    }
}

/// One index probed from several threads at once: the probes run on the device's lanes (two
/// streams, one probe's copies beside another's kernels) and each answer is the one the same
/// probe gives alone, for the k nearest, a radius and a certified metric.
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_index_probed_from_several_threads_at_once() {
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(23);
    let right = batch(&random_rows(&mut rng, 5000, DIM, 300, &[]));
    for kind in [
        MetricKind::Cosine,
        MetricKind::Manhattan,
        MetricKind::JensenShannon,
    ] {
        let m = metric(kind, DIM);
        let index = GpuIndex::build(&right, &m, &GpuOptions::default()).unwrap();
        let pieces: Vec<SparseBatch> = (0..8).map(|i| right.slice(i * 600, 700)).collect();
        let alone = index
            .probe(&pieces[0], Selection::Nearest(9), ProbeOptions::default())
            .unwrap();
        let mut distances = alone.distance.clone();
        distances.sort_by(f64::total_cmp);
        let radius = distances[distances.len() / 3];
        for sel in [Selection::Nearest(9), Selection::Within(radius)] {
            let want: Vec<PairList> = pieces
                .iter()
                .map(|p| index.probe(p, sel, ProbeOptions::default()).unwrap())
                .collect();
            for round in 0..3 {
                let at_once: Vec<PairList> = std::thread::scope(|scope| {
                    let handles: Vec<_> = pieces
                        .iter()
                        .map(|p| {
                            let index = &index;
                            scope.spawn(move || {
                                index.probe(p, sel, ProbeOptions::default()).unwrap()
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                for (i, (got, want)) in at_once.iter().zip(&want).enumerate() {
                    assert!(!want.is_empty(), "{kind} {sel:?} piece {i}");
                    assert_eq!(got, want, "{kind} {sel:?} piece {i}, round {round}");
                }
            }
        }
    }
}

/// The inverted lists built on the device (the default for a right side held whole) give the
/// very bits of the host's build (`SPARSE_KNN_GPU_LISTS=host`), whose entries are in row order
/// where the device's land in any order inside a tile: every metric (a max's ranks placed
/// beside the entries), knn and radius, across tiles, with explicit zeros, unsorted rows, null
/// and empty rows, null rows keeping entries in their ranges, column ids sorted on the device
/// (indices up to 2^31) and dense columns on the tensor cores.
#[test]
#[ignore = "needs a CUDA GPU"]
fn lists_built_on_the_device_give_the_hosts_bits() {
    if !gpu_or_skip() {
        return;
    }
    std::env::set_var("SPARSE_KNN_GPU_TILE_ROWS", "256");
    let mut rng = StdRng::seed_from_u64(41);
    let mut direct = random_rows(&mut rng, 2500, DIM, 400, &[]);
    for (r, row) in direct.iter_mut().enumerate() {
        if let Some(row) = row.as_mut().filter(|_| r % 7 == 0) {
            // explicit zeros stay out of the lists
            for (i, entry) in row.iter_mut().enumerate() {
                if i % 3 == 0 {
                    entry.1 = 0.0;
                }
            }
        }
    }
    // The same rows with ids spread up to 2^31 - 1: the column map becomes a sorted search.
    let spread: Vec<_> = direct
        .iter()
        .map(|row| {
            row.as_ref()
                .map(|row| row.iter().map(|&(c, v)| (c * 700_001 + 3, v)).collect())
        })
        .collect();
    let dense = rows_with_dense_columns(&mut rng, 1500, 24, |rng| rng.random_range(1..3000) as f32);
    type Rows = [Option<Vec<(i32, f32)>>];
    let cases: [(&str, &Rows, u64, DenseColumnChoice); 4] = [
        ("direct ids", &direct, DIM, DenseColumnChoice::Off),
        (
            "sorted ids",
            &spread,
            i32::MAX as u64,
            DenseColumnChoice::Off,
        ),
        (
            "dense columns",
            &dense,
            DIM,
            DenseColumnChoice::MinShare(0.15),
        ),
        (
            "null rows keeping entries",
            &direct,
            i32::MAX as u64,
            DenseColumnChoice::Off,
        ),
    ];
    for (case, rows, dim, dense_columns) in cases {
        let right = if case == "null rows keeping entries" {
            with_entries_under_nulls(rows)
        } else {
            batch(rows)
        };
        let left = batch(&rows[..300]);
        let options = GpuOptions {
            dense_columns,
            ..GpuOptions::default()
        };
        for kind in MetricKind::all() {
            let m = metric(kind, dim);
            let mut answers = Vec::new();
            for lists in ["host", "device"] {
                std::env::set_var("SPARSE_KNN_GPU_LISTS", lists);
                let index = GpuIndex::build(&right, &m, &options)
                    .unwrap_or_else(|e| panic!("{case} {kind} {lists}: build: {e}"));
                let po = ProbeOptions {
                    exclude_self_from: Some(0),
                };
                let knn = index.probe(&left, Selection::Nearest(10), po).unwrap();
                // a radius around the 10th neighbour's distance: about ten pairs a row
                let radius = median(&knn.distance);
                let within = index.probe(&left, Selection::Within(radius), po).unwrap();
                answers.push((knn, within));
            }
            std::env::remove_var("SPARSE_KNN_GPU_LISTS");
            let (host, device) = (&answers[0], &answers[1]);
            assert!(!host.0.is_empty(), "{case} {kind}: no pairs");
            for (label, a, b) in [("knn", &host.0, &device.0), ("radius", &host.1, &device.1)] {
                assert_same_bits(a, b, &format!("{case} {kind} {label}"));
            }
        }
    }
    std::env::remove_var("SPARSE_KNN_GPU_TILE_ROWS");
}

/// `rows` as a batch whose null rows keep entries in their ranges (a struct's null slot may keep
/// its lists' values), in columns no valid row has, which no build may read.
fn with_entries_under_nulls(rows: &[Option<Vec<(i32, f32)>>]) -> SparseBatch {
    let (mut offsets, mut indices, mut values) = (vec![0i32], Vec::new(), Vec::new());
    for row in rows {
        let entries = match row {
            Some(row) => row.clone(),
            None => vec![(2_000_000_000, 5.0), (1_999_999_999, 9.0)],
        };
        for (c, v) in entries {
            indices.push(c);
            values.push(v);
        }
        offsets.push(indices.len() as i32);
    }
    let nulls = NullBuffer::from(rows.iter().map(Option::is_some).collect::<Vec<_>>());
    SparseBatch::from_parts(offsets.into(), indices.into(), values.into(), Some(nulls))
}

fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|d| d.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(1.0)
}

/// Under any memory limit the right side's lists come from one of three builds: on the device
/// beside the whole part, on the host for the whole part when the device build's scratch (the
/// CSR and its counters) does not fit beside it, or on the host for each part streamed per probe.
/// A sweep of limits reaches all three, and each gives the bits of the unlimited build (raw
/// counts: every sum is exact, so no rounding hides a difference).
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_memory_limit_gives_the_same_bits_whichever_lists_build_it_takes() {
    if !gpu_or_skip() {
        return;
    }
    std::env::set_var("SPARSE_KNN_GPU_TILE_ROWS", "256");
    let mut rng = StdRng::seed_from_u64(47);
    let counts: Vec<_> = random_rows(&mut rng, 2000, DIM, 300, &[])
        .into_iter()
        .map(|row| {
            row.map(|row| {
                row.into_iter()
                    .map(|(c, v)| (c, (v * 1000.0).round()))
                    .collect()
            })
        })
        .collect();
    let right = batch(&counts);
    let left = batch(&counts[..200]);
    for kind in [
        MetricKind::Cosine,
        MetricKind::Manhattan,
        MetricKind::Chebyshev,
    ] {
        let m = metric(kind, DIM);
        let run = |memory_limit: Option<u64>| {
            // (no dense columns: their number follows the limit, and their products round)
            let options = GpuOptions {
                memory_limit,
                dense_columns: DenseColumnChoice::Off,
                ..GpuOptions::default()
            };
            let index = GpuIndex::build(&right, &m, &options)
                .unwrap_or_else(|e| panic!("{kind}, limit {memory_limit:?}: build: {e}"));
            // (read before a probe adds its own buffers to the peak)
            let (parts, peak) = (index.parts(), index.stats().peak_device_bytes);
            let knn = index
                .probe(&left, Selection::Nearest(10), ProbeOptions::default())
                .unwrap_or_else(|e| panic!("{kind}, limit {memory_limit:?}: probe: {e}"));
            (parts, peak, knn)
        };
        let (parts, device_peak, reference) = run(None);
        assert_eq!(parts, 1, "{kind}: the unlimited build is one part");
        assert!(!reference.is_empty(), "{kind}: no pairs");
        let (mut on_device, mut whole_on_host, mut streamed) = (0, 0, 0);
        let mut limit = device_peak * 3;
        while limit > device_peak / 8 {
            let (parts, peak, knn) = run(Some(limit));
            match parts {
                1 if peak == device_peak => on_device += 1,
                1 => {
                    assert!(
                        peak < device_peak,
                        "{kind}, limit {limit}: a whole part held {peak} bytes, more than the \
                         device build's {device_peak}"
                    );
                    whole_on_host += 1;
                }
                _ => streamed += 1,
            }
            assert_same_bits(&knn, &reference, &format!("{kind}, limit {limit}"));
            limit = limit / 20 * 19;
        }
        assert!(
            on_device > 0 && whole_on_host > 0 && streamed > 0,
            "{kind}: the limits tried reached the device build {on_device} times, the host's \
             whole part {whole_on_host}, streamed parts {streamed}"
        );
    }
    std::env::remove_var("SPARSE_KNN_GPU_TILE_ROWS");
}

/// The same pairs, in the same order, with the same distances to the bit.
fn assert_same_bits(a: &PairList, b: &PairList, what: &str) {
    assert_eq!(a.left, b.left, "{what}: left rows");
    assert_eq!(a.right, b.right, "{what}: right rows");
    let bits = |d: &[f64]| d.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.distance), bits(&b.distance), "{what}: distances");
}

/// The median of the CPU's `k` nearest distances of `left`'s rows: a radius that keeps about
/// half of them.
fn median_knn_distance(index: &CpuIndex, left: &SparseBatch, k: usize) -> f64 {
    let mut ds = cpu::probe(index, left, Selection::Nearest(k), Default::default()).distance;
    ds.sort_by(|a, b| a.total_cmp(b));
    ds[ds.len() / 2]
}
