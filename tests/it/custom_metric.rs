//! Adding a metric is one definition: this test defines one that the crate does not have,
//! Σ|√x − √y| ("root manhattan", a union metric for counts), with `semiring!` alone, and runs it
//! on the CPU backend (in CI) and on the GPU backend (`--ignored`, on a GPU machine), each checked
//! against a float64 reference written here from the formula, over the union of columns.

use datafusion_sparse_knn::cpu::{self, CpuIndex, PairList, ProbeOptions, Selection};
use datafusion_sparse_knn::gpu::{self, kernels, GpuIndex, GpuOptions};
use datafusion_sparse_knn::metric::{row_distance, Params};
use datafusion_sparse_knn::{semiring, SparseBatch};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

semiring! {
    /// Σ|√x − √y| over the union, folded: Σ√x + Σ√y + Σ_shared (|√x − √y| − √x − √y).
    pub struct RootManhattan = "root_manhattan";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Shifted { scale: 1.0 };
    pair_vanishes: true;
    total(x, prm) = [sqrt(x), 0.0];
    pair(x, y, prm) = {
        let sx = sqrt(x);
        let sy = sqrt(y);
        [fabs(sx - sy) - sx - sy, 0.0]
    };
    finish(acc0, acc1, l, r, prm) = { fmax(l.t0 + r.t0 + acc0, 0.0) };
}

const METRIC: RootManhattan = RootManhattan(Params { p: 2.0, d: 1.0 });

/// The definition, independently: over the union, in f64.
fn reference(a: &[(i32, f32)], b: &[(i32, f32)]) -> f64 {
    let mut cols: Vec<i32> = a.iter().chain(b).map(|e| e.0).collect();
    cols.sort_unstable();
    cols.dedup();
    let get = |r: &[(i32, f32)], c: i32| r.iter().find(|e| e.0 == c).map_or(0.0, |e| e.1 as f64);
    cols.iter()
        .map(|&c| (get(a, c).sqrt() - get(b, c).sqrt()).abs())
        .sum()
}

/// Raw counts as users have them: degrees from 1 to 60, values up to a few thousand, some
/// exact duplicates (ties), an empty row and a null row.
fn rows(rng: &mut StdRng, n: usize) -> Vec<Option<Vec<(i32, f32)>>> {
    let mut out: Vec<Option<Vec<(i32, f32)>>> = Vec::new();
    for r in 0..n {
        if r == 7 {
            out.push(None);
        } else if r == 11 {
            out.push(Some(Vec::new()));
        } else if r % 10 == 3 && r > 10 {
            out.push(out[r - 10].clone());
        } else {
            let deg = rng.random_range(1..60);
            let mut cols: Vec<i32> = (0..deg).map(|_| rng.random_range(0..400)).collect();
            cols.sort_unstable();
            cols.dedup();
            out.push(Some(
                cols.into_iter()
                    .map(|c| (c, rng.random_range(1..5000) as f32))
                    .collect(),
            ));
        }
    }
    out
}

fn batch(rows: &[Option<Vec<(i32, f32)>>]) -> SparseBatch {
    SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()))
}

/// Brute force over the reference: the k nearest per left row, ties to the earlier right row.
fn brute_knn(
    left: &[Option<Vec<(i32, f32)>>],
    right: &[Option<Vec<(i32, f32)>>],
    k: usize,
) -> Vec<Vec<(u32, f64)>> {
    left.iter()
        .map(|l| {
            let Some(l) = l else { return Vec::new() };
            let mut d: Vec<(u32, f64)> = right
                .iter()
                .enumerate()
                .filter_map(|(j, r)| r.as_ref().map(|r| (j as u32, reference(l, r))))
                .collect();
            d.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            d.truncate(k);
            d
        })
        .collect()
}

fn per_row(p: &PairList, n: usize) -> Vec<Vec<(u32, f64)>> {
    let mut v = vec![Vec::new(); n];
    for i in 0..p.len() {
        v[p.left[i] as usize].push((p.right[i], p.distance[i]));
    }
    v
}

/// Same neighbours (up to near-ties) and every distance within the SPEC's 1e-4 relative.
fn check(
    name: &str,
    got: &PairList,
    want: &[Vec<(u32, f64)>],
    right: &[Option<Vec<(i32, f32)>>],
    left: &[Option<Vec<(i32, f32)>>],
) {
    let got = per_row(got, want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.len(),
            w.len(),
            "{name}: left row {i}: {} pairs, want {}",
            g.len(),
            w.len()
        );
        for (rank, (&(gj, gd), &(_, wd))) in g.iter().zip(w).enumerate() {
            let tol = 1e-4 * wd.abs().max(1.0);
            assert!(
                (gd - wd).abs() <= tol,
                "{name}: row {i} rank {rank}: {gd} vs {wd}"
            );
            let truth = reference(
                left[i].as_ref().unwrap(),
                right[gj as usize].as_ref().unwrap(),
            );
            assert!(
                (gd - truth).abs() <= tol,
                "{name}: row {i} pair {gj}: {gd}, true {truth}"
            );
        }
    }
}

#[test]
fn a_metric_defined_outside_the_crate_runs_on_the_cpu() {
    let mut rng = StdRng::seed_from_u64(21);
    let right_rows = rows(&mut rng, 600);
    let left_rows: Vec<_> = right_rows.iter().take(80).cloned().collect();
    let (right, left) = (batch(&right_rows), batch(&left_rows));

    // Row by row, through the definition.
    let a = left_rows[0].as_deref().unwrap();
    let b = right_rows[5].as_deref().unwrap();
    let split = |r: &[(i32, f32)]| {
        (
            r.iter().map(|e| e.0).collect::<Vec<_>>(),
            r.iter().map(|e| e.1).collect::<Vec<_>>(),
        )
    };
    let ((ai, av), (bi, bv)) = (split(a), split(b));
    let d = row_distance(&METRIC, (&ai, &av), (&bi, &bv));
    assert!((d - reference(a, b)).abs() <= 1e-9 * reference(a, b).max(1.0));

    let index = CpuIndex::build_with(&right, &METRIC);
    for k in [1, 10, 700] {
        let got = cpu::probe(
            &index,
            &left,
            Selection::Nearest(k),
            ProbeOptions::default(),
        );
        check(
            &format!("cpu k={k}"),
            &got,
            &brute_knn(&left_rows, &right_rows, k),
            &right_rows,
            &left_rows,
        );
    }
    // Radius: exactly the pairs within it (none within 1e-6 of the boundary in this data).
    let radius = 300.0;
    let got = cpu::probe(
        &index,
        &left,
        Selection::Within(radius),
        ProbeOptions::default(),
    );
    let want: Vec<Vec<(u32, f64)>> = brute_knn(&left_rows, &right_rows, usize::MAX)
        .into_iter()
        .map(|mut v| {
            v.retain(|e| e.1 <= radius);
            v.sort_by_key(|e| e.0);
            v
        })
        .collect();
    check("cpu radius", &got, &want, &right_rows, &left_rows);
}

/// Its CUDA module is generated from the definition above and compiles (CI has NVRTC).
#[test]
fn a_metric_defined_outside_the_crate_compiles_for_the_gpu() {
    if !kernels::nvrtc_available() {
        assert!(
            std::env::var("SPARSE_KNN_REQUIRE_NVRTC").is_err(),
            "SPARSE_KNN_REQUIRE_NVRTC is set but libnvrtc cannot be loaded"
        );
        eprintln!("skipped: libnvrtc cannot be loaded");
        return;
    }
    let source = kernels::module_source::<RootManhattan>();
    assert!(
        source.contains("const double sx = sqrt(x);"),
        "the definition's text is the CUDA"
    );
    let ptx = kernels::compile(&source, "root_manhattan", "compute_90").unwrap();
    assert!(ptx.to_src().contains(".entry folded_knn("));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_metric_defined_outside_the_crate_runs_on_the_gpu() {
    assert!(gpu::is_available(), "no CUDA GPU: {}", gpu::describe());
    let mut rng = StdRng::seed_from_u64(21);
    let right_rows = rows(&mut rng, 600);
    let left_rows: Vec<_> = right_rows.iter().take(80).cloned().collect();
    let (right, left) = (batch(&right_rows), batch(&left_rows));
    let index = GpuIndex::build_with(&right, &METRIC, &GpuOptions::default()).unwrap();
    // 2000: above the kernels' own top-k, selected on the host from the device's distances.
    for k in [1, 10, 700, 2000] {
        let got = index
            .probe(&left, Selection::Nearest(k), ProbeOptions::default())
            .unwrap();
        check(
            &format!("gpu k={k}"),
            &got,
            &brute_knn(&left_rows, &right_rows, k),
            &right_rows,
            &left_rows,
        );
    }
}
