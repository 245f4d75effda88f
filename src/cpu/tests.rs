//! The CPU kernels against `Metric::distance` row by row, on data large enough that the index
//! stores popular columns dense, so every layout and every selection key form is exercised.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{probe, probe_parts_with, CpuIndex, PairList, ProbeOptions, Selection, Vectors};
use crate::metric::{Metric, MetricKind};
use crate::vector::SparseBatch;

const DIM: i32 = 400;

type Row = Option<Vec<(i32, f32)>>;

/// Rows with a few very popular columns (dense in the index) and a long tail (postings).
fn rows(rng: &mut StdRng, n: usize, nonnegative: bool) -> Vec<Row> {
    (0..n)
        .map(|_| {
            let mut row = Vec::new();
            for c in 0..DIM {
                let p = if c < 4 {
                    0.9 / (c + 1) as f64
                } else {
                    3.0 / c as f64
                };
                if rng.random_bool(p.min(1.0)) {
                    // Small integers make exact ties common (ties must go to the earlier row).
                    let v = if rng.random_bool(0.3) {
                        rng.random_range(1..4) as f32
                    } else {
                        rng.random_range(0.05f32..3.0)
                    };
                    let negative = !nonnegative && rng.random_bool(0.3);
                    row.push((c, if negative { -v } else { v }));
                }
            }
            Some(row)
        })
        .collect()
}

fn batch(rows: &[Row]) -> SparseBatch {
    SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()))
}

fn metrics() -> Vec<Metric> {
    let mut all: Vec<Metric> = MetricKind::all()
        .map(|k| Metric::from_kind(k, None, Some(DIM as u64 + 5)).unwrap())
        .collect();
    // Minkowski of p = 2 (the default), 3 (products) and 2.5 (the fast pow of `minkowski.rs`).
    for p in [3.0, 2.5] {
        all.push(Metric::from_kind(MetricKind::Minkowski, Some(p), None).unwrap());
    }
    all
}

/// Metrics whose distances are exact small-integer arithmetic, so ties are exact on both sides.
fn exact_ties(kind: MetricKind) -> bool {
    matches!(
        kind,
        MetricKind::Hamming
            | MetricKind::Jaccard
            | MetricKind::Dice
            | MetricKind::RussellRao
            | MetricKind::Chebyshev
    )
}

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn of_left(pairs: &PairList, l: u32) -> Vec<(u32, f64)> {
    (0..pairs.len())
        .filter(|&i| pairs.left[i] == l)
        .map(|i| (pairs.right[i], pairs.distance[i]))
        .collect()
}

/// Brute force: every candidate right row with its distance, nearest first, ties by row.
fn brute(
    metric: &Metric,
    left: &[(i32, f32)],
    right: &SparseBatch,
    skip: Option<usize>,
) -> Vec<(u32, f64)> {
    let (ri, rv): (Vec<i32>, Vec<f32>) = left.iter().copied().unzip();
    let mut all: Vec<(u32, f64)> = (0..right.len())
        .filter(|&j| !right.is_null(j) && skip != Some(j))
        .map(|j| (j as u32, metric.distance((&ri, &rv), right.row(j))))
        .collect();
    let sim = metric.kind.is_similarity();
    all.sort_by(|a, b| {
        let (x, y) = if sim { (-a.1, -b.1) } else { (a.1, b.1) };
        x.total_cmp(&y).then(a.0.cmp(&b.0))
    });
    all
}

fn check_knn(metric: &Metric, left: &[Row], right_rows: &[Row], k: usize, self_join: bool) {
    let right = batch(right_rows);
    let index = CpuIndex::build(&right, metric);
    assert!(
        index.dense_columns() > 0,
        "the test data must reach the dense layout"
    );
    let options = ProbeOptions {
        exclude_self_from: self_join.then_some(0),
    };
    let got = probe(&index, &batch(left), Selection::Nearest(k), options);
    for (l, row) in left.iter().enumerate() {
        let have = of_left(&got, l as u32);
        let Some(row) = row else {
            assert!(have.is_empty(), "{metric}: a null left row matched");
            continue;
        };
        let skip = (self_join && l < right.len()).then_some(l);
        let want = brute(metric, row, &right, skip);
        let want = &want[..k.min(want.len())];
        assert_eq!(have.len(), want.len(), "{metric}: left row {l}");
        for (rank, (h, w)) in have.iter().zip(want).enumerate() {
            assert!(
                close(h.1, w.1),
                "{metric}: left row {l}, rank {rank}: distance {} vs reference {}",
                h.1,
                w.1
            );
            if exact_ties(metric.kind) {
                assert_eq!(h.0, w.0, "{metric}: left row {l}, rank {rank}: tie order");
            } else {
                // Ties within rounding may order either way; the row must still be that near.
                let (ri, rv): (Vec<i32>, Vec<f32>) = row.iter().copied().unzip();
                let d = metric.distance((&ri, &rv), right.row(h.0 as usize));
                assert!(
                    close(d, w.1),
                    "{metric}: left row {l}, rank {rank}: row {} is at {d}",
                    h.0
                );
            }
        }
    }
}

fn check_radius(metric: &Metric, left: &[Row], right_rows: &[Row]) {
    let right = batch(right_rows);
    let index = CpuIndex::build(&right, metric);
    let lb = batch(left);
    // A radius around the median distance of the first left row keeps about half the pairs.
    let first = left.iter().flatten().next().unwrap();
    let ds = brute(metric, first, &right, None);
    let radius = ds[ds.len() / 2].1;
    let got = probe(
        &index,
        &lb,
        Selection::Within(radius),
        ProbeOptions::default(),
    );
    for (l, row) in left.iter().enumerate() {
        let have = of_left(&got, l as u32);
        let Some(row) = row else {
            assert!(have.is_empty());
            continue;
        };
        let mut want = brute(metric, row, &right, None);
        want.sort_by_key(|e| e.0);
        // Pairs right at the radius may fall on either side by rounding.
        let edge = |d: f64| close(d, radius);
        let want: Vec<_> = want
            .into_iter()
            .filter(|e| metric.within(e.1, radius) || edge(e.1))
            .collect();
        let mut wi = want.iter().peekable();
        for h in &have {
            while let Some(w) = wi.next_if(|w| w.0 < h.0) {
                assert!(
                    edge(w.1),
                    "{metric}: left row {l}: row {} at {} missing",
                    w.0,
                    w.1
                );
            }
            let w = wi
                .next()
                .unwrap_or_else(|| panic!("{metric}: left row {l}: extra row {}", h.0));
            assert_eq!(w.0, h.0, "{metric}: left row {l}: extra row {}", h.0);
            assert!(
                close(w.1, h.1),
                "{metric}: left row {l}, row {}: {} vs {}",
                h.0,
                h.1,
                w.1
            );
        }
        for w in wi {
            assert!(
                edge(w.1),
                "{metric}: left row {l}: row {} at {} missing",
                w.0,
                w.1
            );
        }
    }
}

/// Left rows: a null, an empty row, a column unknown to the right side, then ordinary rows.
fn left_rows(rng: &mut StdRng, nonnegative: bool) -> Vec<Row> {
    let mut left = vec![None, Some(vec![]), Some(vec![(DIM + 3, 2.0), (0, 1.0)])];
    left.extend(rows(rng, 25, nonnegative));
    left
}

#[test]
fn knn_matches_brute_force_for_every_metric() {
    for metric in metrics() {
        let mut rng = StdRng::seed_from_u64(7);
        let nonnegative = metric.kind.needs_nonnegative();
        let mut right = rows(&mut rng, 700, nonnegative);
        right[5] = None;
        right[9] = Some(vec![]);
        right[11] = right[10].clone();
        let left = left_rows(&mut rng, nonnegative);
        check_knn(&metric, &left, &right, 7, false);
    }
}

#[test]
fn self_join_excludes_the_same_row() {
    for metric in metrics() {
        let mut rng = StdRng::seed_from_u64(11);
        let right = rows(&mut rng, 400, metric.kind.needs_nonnegative());
        check_knn(&metric, &right[..30], &right, 4, true);
    }
}

#[test]
fn k_beyond_the_right_side_returns_every_valid_row() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut right = rows(&mut rng, 300, true);
    right[0] = None;
    for name in ["cosine", "manhattan", "kl_divergence", "chebyshev"] {
        let metric = Metric::new(name, None, None).unwrap();
        check_knn(&metric, &right[1..4], &right, 1000, false);
    }
}

#[test]
fn radius_matches_brute_force_for_every_metric() {
    for metric in metrics() {
        let mut rng = StdRng::seed_from_u64(5);
        let nonnegative = metric.kind.needs_nonnegative();
        let mut right = rows(&mut rng, 500, nonnegative);
        right[3] = None;
        let left = left_rows(&mut rng, nonnegative);
        check_radius(&metric, &left, &right);
    }
}

/// The selection filter relies on each metric's `finish` being a non-decreasing function of the
/// filter value: checked on every pair of real rows, so a change of a `finish` that breaks the
/// filter's assumption fails here and not only, rarely, as a wrong neighbour.
#[test]
fn distance_never_decreases_with_the_filter_value() {
    use super::folded::{filter_value, FilterLeft};
    use crate::metric::KeyForm;
    use crate::metric::{with_semiring, Semiring};

    for metric in metrics() {
        let index_form = CpuIndex::build(&batch(&[Some(vec![(0, 1.0)])]), &metric).key_form;
        if index_form == KeyForm::Exact {
            continue;
        }
        let mut rng = StdRng::seed_from_u64(13);
        let data = rows(&mut rng, 300, metric.kind.needs_nonnegative());
        with_semiring!(metric, s => {
            for x in data.iter().take(20).flatten() {
                let tx = s.totals(x.iter().map(|e| e.1));
                let left = FilterLeft::new(index_form, &tx);
                let mut pairs: Vec<(f64, f64)> = data
                    .iter()
                    .flatten()
                    .map(|y| {
                        let ty = s.totals(y.iter().map(|e| e.1));
                        let (mut a0, mut a1) = (0.0, 0.0);
                        for &(c, v) in x {
                            if let Some(&(_, w)) = y.iter().find(|e| e.0 == c) {
                                let (p, q) = s.pair(v, w);
                                a0 += p;
                                a1 += q;
                            }
                        }
                        let d = s.finish(a0, a1, &tx, &ty);
                        let d = if metric.kind.is_similarity() { -d } else { d };
                        (filter_value(index_form, a0, index_form.base(&ty), left), d)
                    })
                    .collect();
                pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
                for w in pairs.windows(2) {
                    assert!(w[0].1 <= w[1].1, "{metric}: filter {:?} but distance {:?}", (w[0].0, w[1].0), (w[0].1, w[1].1));
                }
            }
        });
    }
}

/// A cancelled probe stops between tasks: rows after the cancellation are never probed, and the
/// probe reports an error instead of partial pairs.
#[test]
fn a_cancelled_probe_stops_early() {
    use crate::join::{Cancel, JoinIndex};
    let mut rng = StdRng::seed_from_u64(11);
    let right = batch(&rows(&mut rng, 3000, false));
    let left_rows = rows(&mut rng, 60_000, false);
    let left = batch(&left_rows);
    let metric = Metric::from_kind(MetricKind::Minkowski, Some(2.5), None).unwrap();
    let index = CpuIndex::build(&right, &metric);

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

    // Cancelled once some rows are done: the rest are skipped.
    let cancel = Cancel::new();
    let watcher = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            while cancel.rows_probed() < 200 {
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
    let done = cancel.rows_probed();
    assert!(
        done < left.len() as u64 / 2,
        "{done} of {} rows probed after the cancellation",
        left.len()
    );
}

/// Rating-like rows (half stars, as on MovieLens): few distinct values per column, so a lifted
/// metric's posting lists are coded. Column 0 is held by most rows (the dense layout).
fn rating_rows(rng: &mut StdRng, n: usize) -> Vec<Row> {
    (0..n)
        .map(|_| {
            let mut row = Vec::new();
            for c in 0..DIM {
                if rng.random_bool(if c == 0 { 0.9 } else { 12.0 / (c + 20) as f64 }) {
                    row.push((c, rng.random_range(1..=10) as f32 * 0.5));
                }
            }
            Some(row)
        })
        .collect()
}

#[test]
fn coded_posting_lists_give_the_bits_of_plain_ones() {
    let mut rng = StdRng::seed_from_u64(17);
    let right_rows = rating_rows(&mut rng, 800);
    let left_rows = rating_rows(&mut rng, 40);
    let (right, left) = (batch(&right_rows), batch(&left_rows));
    for kind in [
        MetricKind::KlDivergence,
        MetricKind::JensenShannon,
        MetricKind::Hellinger,
    ] {
        let metric = Metric::from_kind(kind, None, None).unwrap();
        let coded = CpuIndex::build(&right, &metric);
        let coded_lists = coded.coded.iter().filter(|(s, e)| e > s).count();
        assert!(coded_lists >= 20, "{metric}: {coded_lists} coded lists");
        let mut plain = CpuIndex::build(&right, &metric);
        plain.coded.clear();
        for selection in [Selection::Nearest(9), Selection::Within(f64::INFINITY)] {
            let options = ProbeOptions::default();
            assert_eq!(
                probe(&coded, &left, selection, options),
                probe(&plain, &left, selection, options),
                "{metric}, {selection:?}"
            );
        }
        check_knn(&metric, &left_rows, &right_rows, 9, false);
    }
}

#[test]
fn every_vector_width_gives_the_same_bits() {
    let widths: Vec<Vectors> = [Vectors::Baseline, Vectors::Avx2, Vectors::Avx512]
        .into_iter()
        .filter(|&w| w <= Vectors::detected())
        .collect();
    assert!(
        widths.len() >= 2,
        "this test compares the baseline kernels with AVX2 or AVX-512 ones: the CPU has neither"
    );
    for metric in metrics() {
        let mut rng = StdRng::seed_from_u64(23);
        let nonnegative = metric.kind.needs_nonnegative();
        let right = batch(&rows(&mut rng, 500, nonnegative));
        let left = batch(&left_rows(&mut rng, nonnegative));
        let index = CpuIndex::build(&right, &metric);
        // Every pair (a radius nothing is outside) and the nearest.
        let everything = if metric.kind.is_similarity() {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
        for selection in [Selection::Nearest(6), Selection::Within(everything)] {
            let options = ProbeOptions::default();
            let probe_on =
                |w| PairList::concat(probe_parts_with(&index, &left, selection, options, w));
            let want = probe_on(widths[0]);
            assert!(!want.is_empty());
            for &w in &widths[1..] {
                assert_eq!(probe_on(w), want, "{metric}, {selection:?}, {w:?}");
            }
        }
    }
}

/// A radius join's filter rule checked a block at once (`Outside::block`) keeps exactly the rows
/// of the rule taken row by row, also where the distance does not follow the filter (which the
/// metrics' filters never do: the block is then redone row by row), with NaNs, zeros of both
/// signs and ties.
#[test]
fn a_block_of_the_radius_filter_rule_keeps_the_rows_of_the_rule_row_by_row() {
    use super::folded::Outside;
    let mut rng = StdRng::seed_from_u64(21);
    let values = [
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.0,
        2.0,
        f64::NAN,
        f64::INFINITY,
        -1.5,
    ];
    let mut redone = 0;
    for case in 0..20_000 {
        let len = rng.random_range(1..=64);
        let pick = |rng: &mut StdRng| {
            if rng.random_bool(0.5) {
                values[rng.random_range(0..values.len())]
            } else {
                rng.random_range(-2.0..2.0)
            }
        };
        let filter: Vec<f64> = (0..len).map(|_| pick(&mut rng)).collect();
        // Mostly a distance that follows the filter (as every metric's does), sometimes not.
        let follows = case % 4 != 0;
        let dist: Vec<f64> = filter
            .iter()
            .map(|&f| if follows { f + 0.25 } else { pick(&mut rng) })
            .collect();
        let radius = pick(&mut rng);
        let inside: Vec<bool> = dist.iter().map(|&d| d <= radius).collect();
        let from = if rng.random_bool(0.3) {
            f64::INFINITY
        } else {
            pick(&mut rng)
        };
        let from = if from.is_nan() { f64::INFINITY } else { from };
        let (mut block, mut by_row) = (inside.clone(), inside.clone());
        let mut a = Outside { from };
        a.block(&filter, &dist, &mut block);
        let mut b = Outside { from };
        b.block_by_row(&filter, &dist, &mut by_row);
        assert_eq!(
            block, by_row,
            "case {case}: {filter:?} {dist:?} {radius} {from}"
        );
        // The least filter outside, the same up to the sign of a zero (which no comparison sees).
        assert!(
            a.from == b.from || (a.from.is_nan() && b.from.is_nan()),
            "case {case}: from {} against {}",
            a.from,
            b.from
        );
        redone += (block != inside) as usize;
    }
    assert!(
        redone > 100,
        "the row by row rule dropped rows in only {redone} cases"
    );
}

/// The certified metrics' answers are `Metric::distance` (the union over both rows, as the GPU's
/// exact step computes it) bit for bit, ties by right row, for knn and radius: on rows of small
/// integers (many exact ties, equal values in shared columns), with long rows, rows sharing no
/// column with the left row, and minkowski of integer, half-integer and other p (the fast pow's
/// bounds).
#[test]
fn certified_answers_are_the_union_distances_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(29);
    let right_rows = rating_rows(&mut rng, 900);
    let mut left_rows = rating_rows(&mut rng, 30);
    left_rows.extend(right_rows[100..110].iter().cloned());
    left_rows.push(Some(vec![(DIM + 7, 3.0), (DIM - 1, 0.5)]));
    let (right, left) = (batch(&right_rows), batch(&left_rows));
    let mut metrics = vec![
        Metric::from_kind(MetricKind::Hellinger, None, None).unwrap(),
        Metric::from_kind(MetricKind::JensenShannon, None, None).unwrap(),
    ];
    for p in [1.0, 2.0, 2.5, 3.0, 1.5, 3.5, 1.37, 7.25] {
        metrics.push(Metric::from_kind(MetricKind::Minkowski, Some(p), None).unwrap());
    }
    for metric in &metrics {
        let index = CpuIndex::build(&right, metric);
        assert!(index.dense_columns() > 0);
        // Each right row's one-sided sum (taken from the union rows' terms) is
        // `one_sided_sum`'s, bit for bit: the disjoint pairs' distances come from it.
        for r in 0..right.len() {
            let entries = &index.row_entries[index.row_ptr[r]..index.row_ptr[r + 1]];
            let want = crate::with_semiring!(metric, s => {
                crate::metric::one_sided_sum(&s, entries, crate::metric::Side::Right)
            });
            assert_eq!(
                index.one_sided[r].to_bits(),
                want.to_bits(),
                "{metric}: right row {r}"
            );
        }
        let k = 8;
        let got = probe(
            &index,
            &left,
            Selection::Nearest(k),
            ProbeOptions::default(),
        );
        let mut radius_at = Vec::new();
        for (l, row) in left_rows.iter().enumerate() {
            let want = brute(metric, row.as_ref().unwrap(), &right, None);
            assert_eq!(of_left(&got, l as u32), want[..k], "{metric}: left row {l}");
            radius_at.push(want[want.len() / 3].1);
        }
        let radius = radius_at[0];
        let got = probe(
            &index,
            &left,
            Selection::Within(radius),
            ProbeOptions::default(),
        );
        for (l, row) in left_rows.iter().enumerate() {
            let mut want = brute(metric, row.as_ref().unwrap(), &right, None);
            want.retain(|e| metric.within(e.1, radius));
            want.sort_by_key(|e| e.0);
            assert_eq!(
                of_left(&got, l as u32),
                want,
                "{metric}: left row {l} within {radius}"
            );
        }
    }
}

/// An index built by several chunks of rows on several threads holds the same lists, in the
/// same order, and the same dense columns as one built on one thread (NULL rows among them).
#[test]
fn an_index_built_on_many_threads_is_the_one_built_on_one() {
    let mut rng = StdRng::seed_from_u64(23);
    let mut rows = rows(&mut rng, 2100, false);
    rows[700] = None;
    let right = batch(&rows);
    let metric = Metric::new("cosine", None, None).unwrap();
    let build = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| CpuIndex::build(&right, &metric))
    };
    let (one, many) = (build(1), build(4));
    assert!(!one.dense_vals.is_empty() && !one.col_rows.is_empty());
    assert_eq!(one.dense_slot, many.dense_slot);
    assert_eq!(one.col_ptr, many.col_ptr);
    assert_eq!(one.col_rows, many.col_rows);
    assert_eq!(one.col_vals, many.col_vals);
    assert_eq!(one.dense_vals, many.dense_vals);
    for col in 0..one.column_count {
        let list = &one.col_rows[one.col_ptr[col]..one.col_ptr[col + 1]];
        assert!(
            list.windows(2).all(|w| w[0] < w[1]),
            "column {col}'s rows increase"
        );
    }
}
