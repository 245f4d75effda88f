//! The kernel of every folded metric: one left row against all right rows.
//!
//! 1. Accumulate the semiring's sum over shared columns into a dense f64 accumulator (one slot per
//!    right row): dense columns with a streaming vectorised pass, four at a time, sparse columns
//!    by scattering their postings. f64 because the folded forms cancel (manhattan, js, the
//!    expanded euclidean); the index keeps the f32 inputs exactly.
//! 2. Select: a cheap *filter* value per right row, of which the distance is a non-decreasing
//!    function (see [`KeyForm`]), is compared block by block against the k-th row's so far; only
//!    rows that beat it are finished (by the semiring's own `finish`) and offered to the heap.
//!
//! The kernel is compiled for baseline x86-64, AVX2+FMA and AVX-512 (chosen at run time, see
//! [`super::vectors`]), so the crate still runs on any x86-64 while the machines we run on get
//! 256- or 512-bit vectors.

use super::index::{CpuIndex, SPARSE};
use super::keep::Keep;
use super::vectors::multiversion;
use crate::join::{within, PairList, Selection, TopK};
use crate::metric::{KeyForm, RowTotals, Semiring};

/// Postings of a lifted metric's pairs computed at once before they are scattered.
const LIFTED_RUN: usize = 128;

/// Scratch of one thread, reused across left rows.
#[derive(Debug, Default)]
pub(crate) struct FoldedScratch {
    pub(crate) acc0: Vec<f64>,
    pub(crate) acc1: Vec<f64>,
    /// The left row's nonzeros by the layout of their column: (dense slot or column id, x).
    pub(crate) dense_hits: Vec<(u32, f32)>,
    pub(crate) sparse_hits: Vec<(u32, f32)>,
    /// A certified metric's left values on coded dense columns (`dense_codes.rs`).
    pub(crate) coded_hits: Vec<(u32, f32)>,
    topk: TopK,
}

impl FoldedScratch {
    pub(crate) fn new(rows: usize, two_accumulators: bool) -> Self {
        Self {
            acc0: vec![0.0; rows],
            acc1: if two_accumulators {
                vec![0.0; rows]
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }
}

multiversion! {
    /// One left row: its pairs are appended to `out` (nearest first for knn, by right row for
    /// radius).
    pub(crate) fn folded_row<S: Semiring>(
        s: &S,
        index: &CpuIndex,
        row: (&[i32], &[f32]),
        left_row: u32,
        keep: Keep<'_>,
        selection: Selection,
        ws: &mut FoldedScratch,
        out: &mut PairList,
    ) => folded_row_impl;
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn folded_row_impl<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    (indices, values): (&[i32], &[f32]),
    left_row: u32,
    keep_row: Keep<'_>,
    selection: Selection,
    ws: &mut FoldedScratch,
    out: &mut PairList,
) {
    let n = index.rows;
    let left_totals = accumulate(s, index, (indices, values), ws);
    let acc0 = &mut ws.acc0[..n];
    let acc1: &mut [f64] = if S::TWO_ACCUMULATORS {
        &mut ws.acc1[..n]
    } else {
        &mut []
    };

    let keep = |j: usize| keep_row.allows(j);
    match selection {
        Selection::Nearest(k) => {
            ws.topk.reset(k);
            select_nearest(s, index, &left_totals, acc0, acc1, &keep, &mut ws.topk);
            for (d, j) in ws.topk.drain_sorted() {
                out.push(left_row, j, if S::SIMILARITY { -d } else { d });
            }
        }
        Selection::Within(radius) => {
            select_within(
                s,
                index,
                &left_totals,
                acc0,
                acc1,
                keep_row,
                radius,
                left_row,
                out,
            );
        }
    }
    acc0.fill(0.0);
    acc1.fill(0.0);
}

/// Appends every kept right row within `radius` of the left row, by right row, block by block:
/// a block's distances are finished in one vectorised loop (every row's, whether kept or not) and
/// the kept rows written without a branch per row.
///
/// Being within the radius is closed downwards in filter order (the distance, negated for a
/// similarity, never decreases with the filter), so once a row at filter f is outside, no row at
/// f or above is within, and a block of such rows is skipped whole (see [`Outside`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn select_within<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    left_totals: &RowTotals,
    acc0: &[f64],
    acc1: &[f64],
    keep_row: Keep<'_>,
    radius: f64,
    left_row: u32,
    out: &mut PairList,
) {
    let n = index.rows;
    let (totals, valid) = (&index.totals[..n], &keep_row.valid[..n]);
    let form = index.key_form;
    let left = FilterLeft::new(form, left_totals);
    let skip = keep_row.skip.unwrap_or(usize::MAX);
    let mut outside = Outside::default();
    let mut filter = [0.0f64; BLOCK];
    let mut dist = [0.0f64; BLOCK];
    let (mut t0, mut t1) = ([0.0f64; BLOCK], [0.0f64; BLOCK]);
    let mut keep = [false; BLOCK];
    let mut pairs = out.row(left_row);
    let mut start = 0;
    while start < n {
        let len = BLOCK.min(n - start);
        let rows = start..start + len;
        let (filter, dist, keep) = (&mut filter[..len], &mut dist[..len], &mut keep[..len]);
        let a0 = &acc0[rows.clone()];
        if form != KeyForm::Exact {
            fill_filters(form, a0, &index.key_base[rows.clone()], left, filter);
            // NaN compares false: such rows are never kept, as their distance is NaN.
            if !filter
                .iter()
                .fold(false, |any, &f| any | (f < outside.from))
            {
                start += len;
                continue;
            }
        }
        // The right rows' totals apart first: the finishing loop then reads contiguous values
        // and vectorises whole (reading them with a stride of two left its last rows scalar).
        let (t0, t1) = (&mut t0[..len], &mut t1[..len]);
        for ((t, t0), t1) in totals[rows.clone()]
            .iter()
            .zip(t0.iter_mut())
            .zip(t1.iter_mut())
        {
            (*t0, *t1) = (t.t0, t.t1);
        }
        if S::TWO_ACCUMULATORS {
            let a1 = &acc1[rows.clone()];
            for i in 0..len {
                let right = RowTotals {
                    t0: t0[i],
                    t1: t1[i],
                };
                dist[i] = s.finish(a0[i], a1[i], left_totals, &right);
            }
        } else {
            for i in 0..len {
                let right = RowTotals {
                    t0: t0[i],
                    t1: t1[i],
                };
                dist[i] = s.finish(a0[i], 0.0, left_totals, &right);
            }
        }
        for (k, &d) in keep.iter_mut().zip(dist.iter()) {
            *k = within(S::SIMILARITY, d, radius);
        }
        if form != KeyForm::Exact {
            outside.block(filter, dist, keep);
        }
        let v = &valid[rows];
        for (i, (k, &v)) in keep.iter_mut().zip(v).enumerate() {
            *k &= v & (start + i != skip);
        }
        pairs.push_kept(start, dist, keep);
        start += len;
    }
}

/// The filter's part of a radius join's choice: a row within the radius is kept only if its
/// filter is below `from`, the least filter of the rows found outside the radius so far (not NaN
/// either), taken in row order. As the distance never decreases with the filter, that never drops
/// a row, and it lets a block whose rows all lie at `from` or above be skipped. [`Outside::block`]
/// checks a whole block at once, with vector instructions, and only a block where the rule would
/// drop a row is redone row by row ([`Outside::block_by_row`]): the pairs are exactly those of
/// the row by row rule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outside {
    pub(crate) from: f64,
}

impl Default for Outside {
    fn default() -> Self {
        Outside {
            from: f64::INFINITY,
        }
    }
}

/// An integer that orders as the double does (`<` of IEEE), for doubles that are not NaN: minima
/// and maxima of integers vectorise, those of doubles (with their NaN rules) did not. A zero of
/// either sign gives the key of +0, as they compare equal.
#[inline(always)]
fn order_key(f: f64) -> i64 {
    let bits = (f + 0.0).to_bits() as i64;
    bits ^ ((bits >> 63) & i64::MAX)
}

/// The double of an [`order_key`].
#[inline(always)]
fn from_order_key(key: i64) -> f64 {
    f64::from_bits((key ^ ((key >> 63) & i64::MAX)) as u64)
}

impl Outside {
    /// One block's rows in order: `inside[i]` (the row within the radius) stays only if
    /// `filter[i]` is below the least filter of the rows outside before it; `from` takes the
    /// block's rows outside.
    #[inline(always)]
    pub(crate) fn block(&mut self, filter: &[f64], dist: &[f64], inside: &mut [bool]) {
        let len = filter.len();
        let (dist, inside) = (&dist[..len], &mut inside[..len]);
        // The least key of the rows outside (with `from`), the largest of the rows inside; NaN
        // filters take the largest key: outside they are passed over (`f < from` fails), inside
        // they send the block to the row by row rule.
        let (mut least_out, mut most_in) = (order_key(self.from), i64::MIN);
        for i in 0..len {
            let (f, d, k) = (filter[i], dist[i], inside[i]);
            let key = if f.is_nan() { i64::MAX } else { order_key(f) };
            least_out = least_out.min(if !k & !d.is_nan() { key } else { i64::MAX });
            most_in = most_in.max(if k { key } else { i64::MIN });
        }
        if most_in < least_out {
            // Every row inside lies below every row outside (and `from`): none is dropped.
            self.from = from_order_key(least_out);
        } else {
            self.block_by_row(filter, dist, inside);
        }
    }

    /// [`Outside::block`]'s rule row by row.
    #[cold]
    pub(crate) fn block_by_row(&mut self, filter: &[f64], dist: &[f64], inside: &mut [bool]) {
        for ((&f, &d), k) in filter.iter().zip(dist).zip(inside.iter_mut()) {
            if !*k & !d.is_nan() & (f < self.from) {
                self.from = f;
            }
            *k &= f < self.from;
        }
    }
}

/// Step 1 for one left row: `ws.acc0[j]` (and `acc1`) get the folded sum over the columns the
/// left row shares with right row j; returns the left row's totals. The caller zeroes the
/// accumulators after use.
#[inline(always)]
pub(crate) fn accumulate<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    row: (&[i32], &[f32]),
    ws: &mut FoldedScratch,
) -> RowTotals {
    let n = index.rows;
    let left_totals = classify(s, index, row, ws);
    let acc0 = &mut ws.acc0[..n];
    let acc1: &mut [f64] = if S::TWO_ACCUMULATORS {
        &mut ws.acc1[..n]
    } else {
        &mut []
    };

    add_dense_hits(s, index, &ws.dense_hits, 0..n, acc0, acc1);
    // Coded dense columns (certified metrics only): a pair per distinct value, a byte per row.
    for &(slot, x) in &ws.coded_hits {
        let Some((distinct, lifts, codes)) = index.dense_codes.column(slot, n) else {
            continue;
        };
        let (lx, mut table0, mut table1) = (s.lift(x), [0.0f64; 256], [0.0f64; 256]);
        for (i, (&y, &ly)) in distinct.iter().zip(lifts).enumerate() {
            (table0[i + 1], table1[i + 1]) = s.pair_lifted(x, lx, y, ly);
        }
        for (a, &code) in acc0.iter_mut().zip(codes) {
            *a += table0[code as usize];
        }
        if S::TWO_ACCUMULATORS {
            for (a, &code) in acc1.iter_mut().zip(codes) {
                *a += table1[code as usize];
            }
        }
    }

    let hits = &ws.sparse_hits;
    for (h, &(col, x)) in hits.iter().enumerate() {
        prefetch_next_lists::<S>(index, hits, h);
        let postings = index.col_ptr[col as usize]..index.col_ptr[col as usize + 1];
        add_postings(s, index, (col, x), postings, 0, acc0, acc1);
    }

    left_totals
}

/// The left row's totals, and its nonzeros on columns of the right side by their layout
/// (`ws.dense_hits`, `ws.coded_hits`, `ws.sparse_hits`), in the row's order.
#[inline(always)]
pub(crate) fn classify<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    (indices, values): (&[i32], &[f32]),
    ws: &mut FoldedScratch,
) -> RowTotals {
    let n = index.rows;
    let left_totals = s.totals(values.iter().copied().filter(|v| *v != 0.0));
    ws.dense_hits.clear();
    ws.sparse_hits.clear();
    ws.coded_hits.clear();
    for (&c, &x) in indices.iter().zip(values) {
        if x == 0.0 {
            continue;
        }
        let Some(col) = index.columns.get(c) else {
            continue;
        };
        match index.dense_slot[col as usize] {
            SPARSE => ws.sparse_hits.push((col, x)),
            slot if index.dense_codes.column(slot, n).is_some() => ws.coded_hits.push((slot, x)),
            slot => ws.dense_hits.push((slot, x)),
        }
    }
    left_totals
}

/// The dense columns `hits` (slot, left value) of one left row added to the accumulators of the
/// right rows `rows` (`acc0[i]` is right row `rows.start + i`'s), four columns at a time.
#[inline(always)]
pub(crate) fn add_dense_hits<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    hits: &[(u32, f32)],
    rows: std::ops::Range<usize>,
    acc0: &mut [f64],
    acc1: &mut [f64],
) {
    let n = index.rows;
    let range = |slot: u32| slot as usize * n + rows.start..slot as usize * n + rows.end;
    let dense = |slot: u32| Column {
        vals: &index.dense_vals[range(slot)],
        lifts: if S::LIFTED {
            &index.dense_lifts[range(slot)]
        } else {
            &[]
        },
    };
    let left = |x: f32| (x, s.lift(x));
    let mut groups = hits.chunks_exact(4);
    for g in &mut groups {
        let cols = [dense(g[0].0), dense(g[1].0), dense(g[2].0), dense(g[3].0)];
        let xs = [left(g[0].1), left(g[1].1), left(g[2].1), left(g[3].1)];
        add_dense::<S, 4>(s, cols, xs, acc0, acc1);
    }
    for &(slot, x) in groups.remainder() {
        add_dense::<S, 1>(s, [dense(slot)], [left(x)], acc0, acc1);
    }
}

/// Each list starts where the last one's prefetching did not reach: the first lines of its
/// rows, values and lifts missed the cache (about a fifth of `perf`'s samples of a
/// jensenshannon join fell on those loads). The list after `hits[h]` is asked for now, the
/// column pointer of the one after it too.
#[inline(always)]
pub(crate) fn prefetch_next_lists<S: Semiring>(index: &CpuIndex, hits: &[(u32, f32)], h: usize) {
    if let Some(&(next, _)) = hits.get(h + 2) {
        prefetch(&index.col_ptr, next as usize + 1);
    }
    if let Some(&(next, _)) = hits.get(h + 1) {
        let at = index.col_ptr[next as usize];
        prefetch(&index.col_rows, at);
        prefetch(&index.col_vals, at);
        if S::LIFTED {
            prefetch(&index.col_lifts, at);
            prefetch(&index.col_lifts, at + 8);
            prefetch(&index.col_codes, at);
        }
    }
}

/// The postings `postings` (a range of column `col`'s list) paired with the left value `x`,
/// added to the accumulators: right row j's sum is `acc0[j - first]`.
#[inline(always)]
pub(crate) fn add_postings<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    (col, x): (u32, f32),
    postings: std::ops::Range<usize>,
    first: usize,
    acc0: &mut [f64],
    acc1: &mut [f64],
) {
    let (start, end) = (postings.start, postings.end);
    let rows = &index.col_rows[start..end];
    let vals = &index.col_vals[start..end];
    let lx = s.lift(x);
    if let Some((distinct, lifts)) = index.coded_column(col as usize).filter(|_| S::LIFTED) {
        // A coded list's pairs, one per distinct value (a code is a byte: no bounds check).
        let mut coded0 = [0.0f64; 256];
        let mut coded1 = [0.0f64; 256];
        for ((t0, t1), (&y, &ly)) in coded0
            .iter_mut()
            .zip(coded1.iter_mut())
            .zip(distinct.iter().zip(lifts))
        {
            (*t0, *t1) = s.pair_lifted(x, lx, y, ly);
        }
        for (&j, &code) in rows.iter().zip(&index.col_codes[start..end]) {
            acc0[j as usize - first] += coded0[code as usize];
            if S::TWO_ACCUMULATORS {
                acc1[j as usize - first] += coded1[code as usize];
            }
        }
    } else if S::LIFTED {
        // A lifted pair is costly (jensenshannon takes a log per pair): computed over a run
        // of postings first, a loop over contiguous values that vectorises, then scattered.
        // In one loop with the scatter it ran one pair at a time.
        let lifts = &index.col_lifts[start..end];
        let mut terms0 = [0.0f64; LIFTED_RUN];
        let mut terms1 = [0.0f64; LIFTED_RUN];
        for ((rows, vals), lifts) in rows
            .chunks(LIFTED_RUN)
            .zip(vals.chunks(LIFTED_RUN))
            .zip(lifts.chunks(LIFTED_RUN))
        {
            let n = rows.len();
            for ((t0, t1), (&y, &ly)) in terms0[..n]
                .iter_mut()
                .zip(terms1[..n].iter_mut())
                .zip(vals.iter().zip(lifts))
            {
                (*t0, *t1) = s.pair_lifted(x, lx, y, ly);
            }
            for (i, &j) in rows.iter().enumerate() {
                acc0[j as usize - first] += terms0[i];
                if S::TWO_ACCUMULATORS {
                    acc1[j as usize - first] += terms1[i];
                }
            }
        }
    } else {
        for (&j, &y) in rows.iter().zip(vals) {
            let (a, b) = s.pair_lifted(x, lx, y, 0.0);
            acc0[j as usize - first] += a;
            if S::TWO_ACCUMULATORS {
                acc1[j as usize - first] += b;
            }
        }
    }
}

/// Asks for the cache line holding `slice[at]` (past the end, nothing to read: a prefetch never
/// faults). A hint only: the values read are the same.
#[inline(always)]
fn prefetch<T>(slice: &[T], at: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and never faults, whatever the address;
    // `wrapping_add` makes the address without claiming it lies in the slice.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(slice.as_ptr().wrapping_add(at) as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, at);
}

/// One dense column: its values and, for a lifted metric, their lifts.
#[derive(Clone, Copy)]
struct Column<'a> {
    vals: &'a [f32],
    lifts: &'a [f64],
}

/// `acc[j] += Σ_g pair(x_g, col_g[j])` over all right rows: a streaming loop the compiler
/// vectorises (f32 loads widened to f64), in place of a scatter through postings. `xs` holds each
/// left value with its lift. A pair that does not vanish on zeros (`Semiring::PAIR_VANISHES`) is
/// masked: the zeros of the dense column are skipped.
#[inline(always)]
fn add_dense<S: Semiring, const G: usize>(
    s: &S,
    cols: [Column; G],
    xs: [(f32, f64); G],
    acc0: &mut [f64],
    acc1: &mut [f64],
) {
    let n = acc0.len();
    let masked = !S::PAIR_VANISHES;
    let vals = cols.map(|c| &c.vals[..n]);
    let lifts = cols.map(|c| if S::LIFTED { &c.lifts[..n] } else { &[][..] });
    let lift = |g: usize, j: usize| if S::LIFTED { lifts[g][j] } else { 0.0 };
    if S::TWO_ACCUMULATORS {
        let acc1 = &mut acc1[..n];
        for j in 0..n {
            let (mut a, mut b) = (0.0, 0.0);
            for g in 0..G {
                let y = vals[g][j];
                if !masked || y != 0.0 {
                    let (p, q) = s.pair_lifted(xs[g].0, xs[g].1, y, lift(g, j));
                    a += p;
                    b += q;
                }
            }
            acc0[j] += a;
            acc1[j] += b;
        }
    } else {
        for j in 0..n {
            let mut a = 0.0;
            for g in 0..G {
                let y = vals[g][j];
                if !masked || y != 0.0 {
                    a += s.pair_lifted(xs[g].0, xs[g].1, y, lift(g, j)).0;
                }
            }
            acc0[j] += a;
        }
    }
}

/// What the filter needs of the left row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FilterLeft {
    total: f64,
    norm: f64,
    scale: f64,
}

impl FilterLeft {
    pub(crate) fn new(form: KeyForm, totals: &RowTotals) -> Self {
        Self {
            total: totals.t0,
            norm: totals.t0.sqrt(),
            scale: match form {
                KeyForm::Shifted { scale } => scale,
                _ => 1.0,
            },
        }
    }
}

/// A right row's filter value (see [`KeyForm`]) from its accumulated sum and `key_base`: exactly
/// the double that the metric's `finish` computes before its non-decreasing tail, so rows never
/// order differently by filter than by distance (up to ties, which the distance then breaks).
#[inline(always)]
pub(crate) fn filter_value(form: KeyForm, acc: f64, base: f64, left: FilterLeft) -> f64 {
    match form {
        KeyForm::Negated => -acc,
        // finish: 1 for a zero row on either side, as for acc = 0.
        KeyForm::Quotient if base == 0.0 || left.norm == 0.0 => 0.0,
        KeyForm::Quotient => -(acc / (left.norm * base)),
        KeyForm::Shifted { .. } => (left.total + base) * left.scale + acc,
        KeyForm::Exact => unreachable!("the exact form filters by the distance"),
    }
}

/// The filter values of a block of right rows (any form but [`KeyForm::Exact`]), one vectorised
/// loop per form.
#[inline(always)]
fn fill_filters(form: KeyForm, acc: &[f64], base: &[f64], left: FilterLeft, out: &mut [f64]) {
    let (acc, base) = (&acc[..out.len()], &base[..out.len()]);
    macro_rules! fill {
        ($form:expr) => {
            for i in 0..out.len() {
                out[i] = filter_value($form, acc[i], base[i], left);
            }
        };
    }
    match form {
        KeyForm::Negated => fill!(KeyForm::Negated),
        KeyForm::Quotient => fill!(KeyForm::Quotient),
        KeyForm::Shifted { scale } => fill!(KeyForm::Shifted { scale }),
        KeyForm::Exact => unreachable!("the exact form filters by the distance"),
    }
}

/// Right rows per admission test: a block's filter values are computed with vector instructions,
/// and a block where none beats the k-th row so far costs one comparison per row.
pub(crate) const BLOCK: usize = 64;

/// Offers every kept right row to `topk`: rows whose filter value (see [`KeyForm`]) beats the
/// k-th row's are finished and pushed by their true distance.
#[inline(always)]
fn select_nearest<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    left_totals: &RowTotals,
    acc0: &[f64],
    acc1: &[f64],
    keep: &impl Fn(usize) -> bool,
    topk: &mut TopK,
) {
    let n = index.rows;
    let base = &index.key_base[..];
    let totals = &index.totals[..n];
    let negate = S::SIMILARITY;
    let left = FilterLeft::new(index.key_form, left_totals);
    let finish = |j: usize| {
        let a1 = if S::TWO_ACCUMULATORS { acc1[j] } else { 0.0 };
        let d = s.finish(acc0[j], a1, left_totals, &totals[j]);
        if negate {
            -d
        } else {
            d
        }
    };
    let mut filter = [0.0f64; BLOCK];
    let mut start = 0;
    while start < n {
        let len = BLOCK.min(n - start);
        let filter = &mut filter[..len];
        let a0 = &acc0[start..start + len];
        if index.key_form == KeyForm::Exact {
            for (i, f) in filter.iter_mut().enumerate() {
                *f = finish(start + i);
            }
        } else {
            fill_filters(index.key_form, a0, &base[start..start + len], left, filter);
        }
        let bound = topk.filter_bound();
        // Not below the bound means not nearer than the k-th row (rows come in increasing order,
        // so a tie does not displace it either); NaN never gets in, as in `TopK::push`.
        if !topk.is_full() || filter.iter().fold(false, |any, &f| any | (f < bound)) {
            for (i, &f) in filter.iter().enumerate() {
                let j = start + i;
                if (!topk.is_full() || f < topk.filter_bound()) && keep(j) {
                    topk.push_filtered(finish(j), j as u32, f);
                }
            }
        }
        start += len;
    }
}
