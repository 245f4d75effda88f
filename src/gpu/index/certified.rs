//! Certified metrics (minkowski, hellinger, jensenshannon; chebyshev's max): bounds from the
//! kernels, exact distances from the host (`join::ExactRows`), and the candidate pass for left
//! rows the first pass cannot settle.

use datafusion::common::Result;
use rayon::prelude::*;

use super::super::args::DevPtr;
use super::super::stats::GpuStats;
use crate::join::{Cancel, ExactRows, PairList, ProbeOptions, Selection};
use crate::metric::sorted_nonzeros;
use crate::vector::SparseBatch;

use super::*;

/// What the kernels return for a certified metric: distances, or their lower bounds; and for
/// radius joins, a radius per left row.
#[derive(Clone, Copy)]
pub(super) struct Bounds<'a> {
    pub(super) lower: bool,
    pub(super) row_radius: Option<&'a [f64]>,
    /// Leave out the pairs that share no column (their distances come from the host).
    pub(super) shared_only: bool,
    /// The left rows to compute (all when absent).
    pub(super) active_rows: Option<&'a [bool]>,
    /// With `shared_only`: the one-sided sums on the device (left rows of the probe, right rows
    /// of the index), from which the kernels take the pairs sharing no column themselves.
    pub(super) one_sided: Option<(DevPtr, DevPtr)>,
    /// A masked probe: only the rows the mask passes are offered (see `probe_masked`).
    pub(super) mask: Option<&'a RowMask>,
    /// `within=COLUMN` (see `probe_grouped`): the device addresses of the left rows' and the
    /// right rows' groups.
    pub(super) groups: Option<(DevPtr, DevPtr)>,
}
impl Bounds<'_> {
    pub(super) const NONE: Bounds<'static> = Bounds {
        lower: false,
        row_radius: None,
        shared_only: false,
        active_rows: None,
        one_sided: None,
        mask: None,
        groups: None,
    };
}
/// Where each left row's pairs start in a list of `rows` left rows grouped by left row (or
/// where they go, for a counting sort of an ungrouped list).
pub(super) fn left_row_starts(left_of_pair: &[u32], rows: usize) -> Vec<usize> {
    let mut starts = vec![0usize; rows + 1];
    for &l in left_of_pair {
        starts[l as usize + 1] += 1;
    }
    for l in 0..rows {
        starts[l + 1] += starts[l];
    }
    starts
}
/// Adds the exact distances of left row `l` to the right rows `candidates` to its `row`.
pub(super) fn add_exact(
    exact: &ExactRows,
    left: &SparseBatch,
    l: usize,
    candidates: &[u32],
    row: &mut Vec<(f64, u32)>,
) {
    if candidates.is_empty() {
        return;
    }
    let x = sorted_nonzeros(left.row(l));
    let x_one_sided = exact.left_one_sided(&x);
    row.extend(
        candidates
            .iter()
            .map(|&j| (exact.distance(&x, x_one_sided, j as usize), j)),
    );
}
/// A row's k-th exact distance (infinity when it has fewer) and whether rows the first pass
/// left out could still enter its answer. Rows left out come after the last one kept in (lower
/// bound, row) order, so after the k-th answer when that one is before it: then none can enter
/// (ties included, where bounds are exact: a max's mostly are).
pub(super) fn row_settled(
    row: &[(f64, u32)],
    lower: &PairList,
    range: std::ops::Range<usize>,
    k: usize,
    wide: usize,
) -> (f64, bool) {
    let answer_k = (row.len() == k).then(|| row[k - 1]);
    let last = range
        .clone()
        .map(|i| (lower.distance[i], lower.right[i]))
        .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let done = range.len() < wide
        || matches!((answer_k, last), (Some(a), Some(last))
            if a.0.total_cmp(&last.0).then(a.1.cmp(&last.1)).is_lt());
    (answer_k.map_or(f64::INFINITY, |a| a.0), !done)
}

/// A row's exact pairs cut to the answer: the k nearest, or those within the radius by right row.
/// A right row can come twice only through a column the kernels saw and the exact rows do not
/// (an explicit zero); it has one distance either way.
pub(super) fn keep_answer(row: &mut Vec<(f64, u32)>, selection: Selection) {
    match selection {
        Selection::Nearest(k) => {
            row.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            row.dedup();
            row.truncate(k);
        }
        Selection::Within(radius) => {
            row.retain(|&(d, _)| d <= radius);
            row.sort_unstable_by_key(|e| e.1);
            row.dedup();
        }
    }
}
pub(super) fn into_pairs(rows: Vec<Vec<(f64, u32)>>) -> PairList {
    let mut out = PairList::default();
    for (l, row) in rows.into_iter().enumerate() {
        for (d, j) in row {
            out.push(l as u32, j, d);
        }
    }
    out
}
/// How tight the bounds were (a candidate costs a merge of two rows on the host) and how many
/// rows needed the candidate pass; `timing` is when the disjoint rows and the first pass ended.
pub(super) fn log_certified(
    left_rows: usize,
    first_pairs: usize,
    (second_rows, candidates): (usize, usize),
    rows: &[Vec<(f64, u32)>],
    started: std::time::Instant,
    [disjoint_s, first_s]: [f64; 2],
) {
    log::debug!(
        "certified: {left_rows} left rows, {} kept; rows sharing no column {disjoint_s:.3} s; \
         first pass {first_pairs} pairs, {:.3} s; candidate pass over {second_rows} rows, \
         {candidates} candidates; {:.3} s in all",
        rows.iter().map(Vec::len).sum::<usize>(),
        first_s - disjoint_s,
        started.elapsed().as_secs_f64()
    );
}
impl GpuIndex {
    /// A sum with an exact union term (minkowski, hellinger, jensenshannon) or a max over the
    /// union (chebyshev), exactly: a folded sum cancels for large, nearly equal values, and a max
    /// read from the inverted lists knows only which of each row's 32 largest entries are shared,
    /// so the kernels return bounds instead (the folded sum shifted by its proven rounding error;
    /// a max's are exact unless a row's 32 largest are all shared or a shared difference is not
    /// a float: it is rounded down to one). Candidates are computed exactly over the union on the
    /// host and selected there.
    ///
    /// k nearest: a first pass keeps each left row's `wide` rows of smallest (lower bound, row);
    /// computed exactly, they give a k-th answer (D, row); when that comes before the last row
    /// kept, no row left out can enter and the left row is done. Only the other rows run the
    /// candidate pass: every right row whose lower bound is within D. A radius: the candidate
    /// pass within the radius. Where the metric allows it ([`ExactRows::finds_disjoint_rows`]),
    /// the kernels leave out the pairs that share no column: the host finds a left row's nearest
    /// such rows exactly from the rows' one-sided sums (such rows tie in large groups that any
    /// bound of nonzero width would admit whole).
    pub(super) fn probe_certified(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        stats: &mut GpuStats,
    ) -> Result<PairList> {
        if let Some(rows) = self
            .exact_rows
            .as_ref()
            .filter(|_| !matches!(selection, Selection::Nearest(k) if k > MAX_DEVICE_K))
        {
            return self.probe_certified_on_device(rows, left, selection, options, cancel, stats);
        }
        let exact = self
            .exact
            .as_ref()
            .expect("certified metrics keep the exact distance")
            .clone();
        let started = std::time::Instant::now();
        let shared_only = exact.finds_disjoint_rows();
        // Each left row's answer so far: its nearest rows (or rows within the radius) among
        // those sharing no column.
        let mut rows: Vec<Vec<(f64, u32)>> = (0..left.len())
            .into_par_iter()
            .map(|l| {
                if !shared_only || left.is_null(l) {
                    return Vec::new();
                }
                let x = sorted_nonzeros(left.row(l));
                let skip = options.excluded_right_row(l, self.rows);
                exact.disjoint_rows(&x, exact.left_one_sided(&x), selection, skip)
            })
            .collect();
        let disjoint_done = started.elapsed().as_secs_f64();
        let kth = |row: &[(f64, u32)], k: usize| match row.len() {
            n if n == k && k > 0 => row[k - 1].0,
            _ => f64::INFINITY,
        };
        // Each row's radius for the candidate pass (the k-th distance of rows found so far, or
        // an upper bound on the k-th), and the rows that still need it.
        let mut first_pairs = 0;
        let (row_radius, active_rows): (Option<Vec<f64>>, Option<Vec<bool>>) = match selection {
            Selection::Nearest(k) if k <= MAX_DEVICE_K => {
                let wide = (2 * k).max(k + 16).min(MAX_DEVICE_K);
                let lower = self.with_device(|inner, lanes| {
                    self.probe_locked(
                        inner,
                        lanes,
                        left,
                        Selection::Nearest(wide),
                        options,
                        cancel,
                        stats,
                        Bounds {
                            lower: true,
                            row_radius: None,
                            shared_only,
                            active_rows: None,
                            one_sided: None,
                            mask: None,
                            groups: None,
                        },
                    )
                })?;
                first_pairs = lower.len();
                let starts = left_row_starts(&lower.left, left.len());
                let (radius, open): (Vec<f64>, Vec<bool>) = rows
                    .par_iter_mut()
                    .enumerate()
                    .map(|(l, row)| {
                        let range = starts[l]..starts[l + 1];
                        add_exact(&exact, left, l, &lower.right[range.clone()], row);
                        keep_answer(row, selection);
                        row_settled(row, &lower, range, k, wide)
                    })
                    .unzip();
                if !open.contains(&true) {
                    let timing = [disjoint_done, started.elapsed().as_secs_f64()];
                    log_certified(left.len(), lower.len(), (0, 0), &rows, started, timing);
                    return Ok(into_pairs(rows));
                }
                (Some(radius), Some(open))
            }
            Selection::Nearest(k) if shared_only => {
                (Some(rows.iter().map(|row| kth(row, k)).collect()), None)
            }
            Selection::Nearest(_) | Selection::Within(_) => (None, None),
        };
        let within = match selection {
            Selection::Nearest(_) => f64::INFINITY,
            Selection::Within(radius) => radius,
        };
        let first_done = started.elapsed().as_secs_f64();
        let candidates = self.with_device(|inner, lanes| {
            self.probe_locked(
                inner,
                lanes,
                left,
                Selection::Within(within),
                options,
                cancel,
                stats,
                Bounds {
                    lower: true,
                    row_radius: row_radius.as_deref(),
                    shared_only,
                    active_rows: active_rows.as_deref(),
                    one_sided: None,
                    mask: None,
                    groups: None,
                },
            )
        })?;
        cancel.check()?;
        // Candidates come in no order: grouped by left row with a counting sort.
        let starts = left_row_starts(&candidates.left, left.len());
        let mut fill = starts.clone();
        let mut by_left = vec![0u32; candidates.len()];
        for (&l, &j) in candidates.left.iter().zip(&candidates.right) {
            by_left[fill[l as usize]] = j;
            fill[l as usize] += 1;
        }
        let found = candidates.len();
        drop(candidates);
        rows.par_iter_mut().enumerate().for_each(|(l, row)| {
            add_exact(&exact, left, l, &by_left[starts[l]..starts[l + 1]], row);
            keep_answer(row, selection);
        });
        let second_rows = active_rows.map_or(left.len(), |a| a.iter().filter(|&&o| o).count());
        let timing = [disjoint_done, first_done];
        log_certified(
            left.len(),
            first_pairs,
            (second_rows, found),
            &rows,
            started,
            timing,
        );
        Ok(into_pairs(rows))
    }

    /// Left rows whose pairs with every right row may be held at once.
    pub(super) fn rows_per_step_of_every_pair(&self) -> usize {
        (self.budget / 4 / (self.rows.max(1) as u64 * 16)).clamp(1, 4096) as usize
    }

    /// [`GpuIndex::probe_certified`]; a k above the kernels' whose radius nothing bounds (no
    /// disjoint rows found on the host: chebyshev) makes every pair a candidate, so the left rows
    /// go a few at a time, as in [`GpuIndex::probe_large_k`].
    pub(super) fn probe_certified_in_steps(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        stats: &mut GpuStats,
    ) -> Result<PairList> {
        let unbounded = matches!(selection, Selection::Nearest(k) if k > MAX_DEVICE_K)
            && !self.exact.as_ref().is_some_and(|e| e.finds_disjoint_rows());
        let step = self.rows_per_step_of_every_pair();
        if !unbounded || left.len() <= step {
            return self.probe_certified(left, selection, options, cancel, stats);
        }
        let mut out = PairList::default();
        for r0 in (0..left.len()).step_by(step) {
            let rows = step.min(left.len() - r0);
            let part = self.probe_certified(
                &left.slice(r0, rows),
                selection,
                options.shifted(r0),
                cancel,
                stats,
            )?;
            for i in 0..part.len() {
                out.push(part.left[i] + r0 as u32, part.right[i], part.distance[i]);
            }
        }
        Ok(out)
    }
}
