//! A launch of fewer left rows than the device has blocks cuts the right side's tiles into
//! groups, a block per (left row, group), and the host merges each row's groups (one row against
//! 10M right rows had been one SM's work). With one, two and five left rows against 24 tiles, on
//! raw counts in the thousands with exact copies (ties) and rows sharing no column (distance
//! ties at the metric's value for a zero sum), every metric's answer is the CPU's, and the very
//! bits of the same probe with the groups turned off: same rows in the same order (ties in right
//! row order), same distances.
//!
//! These need a CUDA GPU: `cargo test --release --test gpu tile_groups -- --ignored`.

use datafusion_sparse_knn::cpu::{self, CpuIndex, ProbeOptions, Selection};
use datafusion_sparse_knn::gpu::{GpuIndex, GpuOptions};
use datafusion_sparse_knn::metric::MetricKind;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{assert_same_bits, batch, compare, gpu_or_skip, metric, random_rows, DIM};

#[test]
#[ignore = "needs a CUDA GPU"]
fn few_left_rows_cut_the_tiles_into_groups_with_the_same_bits() {
    if !gpu_or_skip() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(41);
    // Counts: the generator's values (0.01..3) scaled to 1..3000 and rounded.
    let right_rows: Vec<_> = random_rows(&mut rng, 6000, DIM, 300, &[])
        .into_iter()
        .map(|row| {
            row.map(|r| {
                r.into_iter()
                    .map(|(c, v)| (c, (v * 1000.0).round().max(1.0)))
                    .collect()
            })
        })
        .collect();
    let right = batch(&right_rows);
    // 256-row tiles: 24 of them.
    std::env::set_var("SPARSE_KNN_GPU_TILE_ROWS", "256");
    for kind in MetricKind::all() {
        let m = metric(kind, DIM);
        let cpu_index = CpuIndex::build(&right, &m);
        let gpu_index = GpuIndex::build(&right, &m, &GpuOptions::default())
            .unwrap_or_else(|e| panic!("{kind}: build: {e}"));
        for (n_left, k, first) in [(1, 10, 5usize), (2, 40, 106), (5, 1, 1000)] {
            let left = batch(&right_rows[first..first + n_left]);
            for exclude in [None, Some(first as i64)] {
                let po = ProbeOptions {
                    exclude_self_from: exclude,
                };
                let sel = Selection::Nearest(k);
                let what = format!("{kind} {n_left} rows k={k} exclude={exclude:?}");
                let grouped = gpu_index
                    .probe(&left, sel, po)
                    .unwrap_or_else(|e| panic!("{what}: probe: {e}"));
                std::env::set_var("SPARSE_KNN_GPU_TILE_GROUPS", "1");
                let whole = gpu_index.probe(&left, sel, po);
                std::env::remove_var("SPARSE_KNN_GPU_TILE_GROUPS");
                let whole = whole.unwrap_or_else(|e| panic!("{what}: probe: {e}"));
                assert_same_bits(&grouped, &whole, &format!("{what}: groups against none"));
                let c = cpu::probe(&cpu_index, &left, sel, po);
                compare(&what, &m, &left, &right, &c, &grouped);
            }
        }
        // (the certified metrics' candidate passes keep a block per row)
        let certified = matches!(
            kind,
            MetricKind::Chebyshev
                | MetricKind::Minkowski
                | MetricKind::Hellinger
                | MetricKind::JensenShannon
        );
        let groups = gpu_index.stats().most_tile_groups;
        assert!(
            certified || groups == 24,
            "{kind}: one left row against 24 tiles: {groups} groups, not one a tile"
        );
    }
    std::env::remove_var("SPARSE_KNN_GPU_TILE_ROWS");
}
