//! Sum metrics with an exact union term (minkowski): exact, with no heuristic step.
//!
//! The folded sum `Σ_X t(x) + Σ_Y t(y) + Σ_{X∩Y} (term(x, y) − t(x) − t(y))` (t = the total term,
//! `term(x, 0)`) costs what a dot product costs, but it cancels when both rows hold large, nearly
//! equal values, so it only *bounds* the union sum. Its rounding error is at most
//! `E = 2(n + 8)·ε·G·(|acc| + 3(L + R))` (n terms summed, each term, total and pair evaluated
//! within a few ulps of its parts, whose sum is at most |acc| + 2(L + R) by the union identity; G
//! is the metric's `ROUNDING_GROWTH`, above 1 where a lifted pair's parts can exceed that), so the
//! true sum lies in `[v − E, v + E]` for the folded value v. Minkowski's folded pass is
//! `minkowski.rs`'s (loops compiled per power); for a p other than 1 to 4 its pairs come from a
//! fast pow whose relative error `pow_error(p)` widens E by `pow_error·(|acc| + 3(L + R))`;
//! jensenshannon's pairs come from `js_filter.rs`'s pair without a full logarithm, within
//! `JS_PAIR_ERROR·(x + y)` each, which widens E by `JS_PAIR_ERROR·(|acc| + 3(L + R))`. A right
//! row whose lower end is above the k-th smallest upper end (or, for a radius, whose lower end is
//! outside the radius) cannot be in the answer; every other row is a candidate whose union sum
//! is computed exactly. The answer is the exact one whatever the data: with well separated neighbours a handful of candidates per
//! left row, with large equal values more. Candidates get the bits of `metric::union_distance`,
//! the function the GPU's exact step uses, over the rows' own indices: the same bits whatever the
//! index holds (one shard of the right side or all of it). `union.rs` computes them with the
//! metric's term evaluated on shared columns only: on raw counts, thousands of short right rows
//! tie at the k-th distance their totals give, and a term per entry of each (a logarithm for
//! jensenshannon, a `pow` for minkowski of a non-integer p) cost more than the folded pass.

use std::any::TypeId;

use super::folded::{accumulate, FoldedScratch, BLOCK};
use super::index::CpuIndex;
use super::js_filter::{JsFilter, JS_PAIR_ERROR};
use super::keep::Keep;
use super::minkowski::{accumulate_minkowski, minkowski_degree, pow_error};
use super::union::UnionLeft;
use super::vectors::multiversion;
use crate::join::{within, PairList, Selection, TopK};
use crate::metric::{
    one_sided_sum, sorted_nonzeros_into, JensenShannon, KeyForm, RowTotals, Semiring, Side,
};

/// Scratch of one thread for this strategy, reused across left rows.
#[derive(Debug, Default)]
pub(crate) struct CertifiedScratch {
    /// The left row's nonzeros, sorted by index (as `metric::sorted_nonzeros` sorts them).
    left: Vec<(i32, f32)>,
    /// The k smallest upper ends so far (their k-th is the cut).
    uppers: TopK,
    /// Every right row's lower end, from the pass that finds the cut.
    lowers: Vec<f64>,
    candidates: Vec<(f64, u32)>,
    /// The left row as the exact step reads it.
    union: UnionLeft,
}

multiversion! {
    /// One left row against every right row, for a sum metric with an exact union term.
    pub(crate) fn certified_row<S: Semiring>(
        s: &S,
        index: &CpuIndex,
        row: (&[i32], &[f32]),
        left_row: u32,
        keep_row: Keep<'_>,
        selection: Selection,
        folded: &mut FoldedScratch,
        ws: &mut CertifiedScratch,
        out: &mut PairList,
    ) => certified_row_impl;
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn certified_row_impl<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    (indices, values): (&[i32], &[f32]),
    left_row: u32,
    keep_row: Keep<'_>,
    selection: Selection,
    folded: &mut FoldedScratch,
    ws: &mut CertifiedScratch,
    out: &mut PairList,
) {
    let n = index.rows;
    let minkowski = minkowski_degree(s);
    let fast_pow = minkowski.is_some_and(|(_, fast)| fast);
    let (pow_error, pow_floor) = pow_error(minkowski.map_or(1.0, |(p, _)| p));
    let js = TypeId::of::<S>() == TypeId::of::<JensenShannon>();
    let left_totals = match minkowski {
        Some((p, _)) => accumulate_minkowski(s, p, index, (indices, values), folded),
        // The filter's own pair, without a logarithm per posting (`js_filter.rs`).
        None if js => accumulate(
            &JsFilter(JensenShannon(s.params())),
            index,
            (indices, values),
            folded,
        ),
        None => accumulate(s, index, (indices, values), folded),
    };
    // The filter pair's own error, relative to the x + y of each shared column.
    let pair_error = if js { JS_PAIR_ERROR } else { 0.0 };
    let acc = &mut folded.acc0[..n];

    sorted_nonzeros_into((indices, values), &mut ws.left);
    let left_one_sided = one_sided_sum(s, &ws.left, Side::Left);
    ws.union.set(s, index, &ws.left, left_one_sided);
    let union = &mut ws.union;
    let mut exact = |j: usize| union.distance(s, index, j);

    let terms = (ws.left.len() + index.max_row_len + 8) as f64;
    // A right row's t0 from `key_base`, which holds exactly it for a shifted key (every
    // certified metric's) in a contiguous array, where `totals` interleaves t1: reading t0 from
    // there took a permute per 8 rows, a tenth of a jensenshannon probe on movielens_full.
    let shifted = matches!(S::KEY, KeyForm::Shifted { .. });
    let bound = |j: usize| -> (f64, f64) {
        let r = if shifted {
            index.key_base[j]
        } else {
            index.totals[j].t0
        };
        let l = left_totals.t0;
        let v = l + r + acc[j];
        let parts = acc[j].abs() + 3.0 * (l + r);
        let e = (2.0 * terms * f64::EPSILON * S::ROUNDING_GROWTH + pair_error) * parts;
        if fast_pow {
            // The fast pow's own error on each pair, and a term's flush to 0 below e^-708.
            let e = e + pow_error * parts + terms * pow_floor;
            return if (v - e).is_finite() && (v + e).is_finite() {
                (v - e, v + e)
            } else {
                (f64::NEG_INFINITY, f64::INFINITY)
            };
        }
        (v - e, v + e)
    };
    let keep = |j: usize| keep_row.allows(j);
    let zero = RowTotals::default();

    ws.candidates.clear();
    match selection {
        Selection::Nearest(k) => {
            // The k-th smallest upper end, block by block as the folded kernel selects: a block
            // none of whose upper ends is below the current k-th costs one vectorised pass.
            ws.uppers.reset(k);
            // The lower ends are kept for the candidate pass (computing each bound twice was a
            // tenth of a jensenshannon join).
            ws.lowers.resize(n, 0.0);
            let mut block = [0.0f64; BLOCK];
            for start in (0..n).step_by(BLOCK) {
                let block = &mut block[..BLOCK.min(n - start)];
                let lowers = &mut ws.lowers[start..start + block.len()];
                for (i, (u, l)) in block.iter_mut().zip(lowers).enumerate() {
                    (*l, *u) = bound(start + i);
                }
                let cut = ws.uppers.filter_bound();
                if block.iter().fold(false, |any, &u| any | (u < cut)) {
                    for (i, &u) in block.iter().enumerate() {
                        if u < ws.uppers.filter_bound() && keep(start + i) {
                            ws.uppers.push(u, (start + i) as u32);
                        }
                    }
                }
            }
            // The candidates: lower ends at or below the cut, found block by block too (a scan
            // of every row's lower end one at a time took an eighth of a jensenshannon join).
            let cut = ws.uppers.filter_bound();
            for start in (0..n).step_by(BLOCK) {
                let block = &ws.lowers[start..(start + BLOCK).min(n)];
                if !block.iter().fold(false, |any, &l| any | (l <= cut)) {
                    continue;
                }
                for (i, &l) in block.iter().enumerate() {
                    let j = start + i;
                    if l <= cut && keep(j) {
                        ws.candidates.push((exact(j), j as u32));
                    }
                }
            }
            ws.candidates
                .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            ws.candidates.truncate(k);
        }
        Selection::Within(radius) => {
            for j in (0..n).filter(|&j| keep(j)) {
                // finish is non-decreasing in the sum: a row outside the radius at its lower end
                // is outside (the margin covers the rounding of finish itself).
                let low = bound(j).0.max(0.0);
                let low = low - low * 1e-12;
                if !within(S::SIMILARITY, s.finish(low, 0.0, &zero, &zero), radius) {
                    continue;
                }
                let d = exact(j);
                if within(S::SIMILARITY, d, radius) {
                    ws.candidates.push((d, j as u32));
                }
            }
        }
    }
    for &(d, j) in &ws.candidates {
        out.push(left_row, j, d);
    }
    acc.fill(0.0);
}
