//! The max-reduced metrics (chebyshev): a max over the union of columns, not a foldable sum. The
//! term is the definition's `exact_term`; the strategy relies on `term(x, 0) = |x|` and
//! `term(0, y) = |y|` (see `Reduction::Max`).
//!
//! For a left row X and a right row Y the distance is the largest of three maxima:
//! - over X ∩ Y of |x − y|: accumulated through the postings of X's columns;
//! - over X \ Y of |x|: with X sorted by |x| descending, it is the |x| of the first column of X
//!   that Y lacks. Walking X's postings in that order, `prefix[j]` counts how many leading columns
//!   of X right row j holds (it can only grow while j holds every column so far);
//! - over Y \ X of |y|: right rows are stored largest |y| first, so it is the first entry whose
//!   column is not in X, and the walk stops as soon as |y| cannot raise the max.
//!
//! So a left row costs its postings plus a few steps per right row, not every right nonzero.
//!
//! A column held by many right rows is stored dense (zeros where a row lacks it), and the left
//! row's dense columns take no part in the order above: a vectorised pass folds `|x − y|` of
//! every right row into its max, which for a row lacking the column is `|x − 0| = |x|`, that
//! column's own term over X \ Y. So the max over a dense column is exact for every row, and only
//! the left row's sparse columns need the prefix. On news20, where a few words are in nearly
//! every post, the scatter of those columns' postings was most of a chebyshev join.

use super::index::{CpuIndex, SPARSE};
use super::keep::Keep;
use super::vectors::multiversion;
use crate::join::{within, PairList, Selection, TopK};
use crate::metric::Semiring;

/// Scratch of one thread, reused across left rows.
#[derive(Debug, Default)]
pub(crate) struct ChebyshevScratch {
    /// Per right row: max |x − y| over shared columns, and the leading columns of X it holds.
    shared: Vec<f64>,
    prefix: Vec<u32>,
    /// Per column id: `stamp` when the current left row holds it.
    left_stamp: Vec<u32>,
    stamp: u32,
    /// The left row's (column id, x) on the right side's sparse columns, largest |x| first.
    sorted: Vec<(u32, f32)>,
    /// The left row's (dense slot, x) on the right side's dense columns.
    dense: Vec<(u32, f32)>,
}

impl ChebyshevScratch {
    pub(crate) fn new(index: &CpuIndex) -> Self {
        Self {
            shared: vec![0.0; index.rows],
            prefix: vec![0; index.rows],
            left_stamp: vec![0; index.column_count],
            stamp: 0,
            sorted: Vec::new(),
            dense: Vec::new(),
        }
    }
}

multiversion! {
    /// `shared[j] = max(shared[j], |x_g − col_g[j]|)` over the left row's dense columns, four
    /// at a time: a streaming loop the compiler vectorises.
    fn dense_max<S: Semiring>(s: &S, index: &CpuIndex, hits: &[(u32, f32)], shared: &mut [f64])
        => dense_max_impl;
}

#[inline(always)]
fn dense_max_impl<S: Semiring>(s: &S, index: &CpuIndex, hits: &[(u32, f32)], shared: &mut [f64]) {
    let n = index.rows;
    let shared = &mut shared[..n];
    let column = |slot: u32| &index.dense_vals[slot as usize * n..(slot as usize + 1) * n];
    let mut groups = hits.chunks_exact(4);
    for g in &mut groups {
        let cols = [
            column(g[0].0),
            column(g[1].0),
            column(g[2].0),
            column(g[3].0),
        ];
        let xs = [g[0].1 as f64, g[1].1 as f64, g[2].1 as f64, g[3].1 as f64];
        for j in 0..n {
            let mut m = shared[j];
            for g in 0..4 {
                let t = s.term(xs[g], cols[g][j] as f64);
                m = if t > m { t } else { m };
            }
            shared[j] = m;
        }
    }
    for &(slot, x) in groups.remainder() {
        let (col, x) = (column(slot), x as f64);
        for j in 0..n {
            let t = s.term(x, col[j] as f64);
            shared[j] = if t > shared[j] { t } else { shared[j] };
        }
    }
}

/// Every kept right row's distance, in right-row order, into `topk` (k nearest) or `out` (within
/// a radius).
#[allow(clippy::too_many_arguments)]
pub(crate) fn chebyshev_row<S: Semiring>(
    vectors: super::vectors::Vectors,
    s: &S,
    index: &CpuIndex,
    (indices, values): (&[i32], &[f32]),
    left_row: u32,
    keep: Keep<'_>,
    selection: Selection,
    ws: &mut ChebyshevScratch,
    topk: &mut TopK,
    out: &mut PairList,
) {
    ws.stamp = ws.stamp.wrapping_add(1);
    if ws.stamp == 0 {
        ws.left_stamp.fill(0);
        ws.stamp = 1;
    }
    let stamp = ws.stamp;
    // Left nonzeros on columns no right row has are missed by every right row.
    let mut outside = 0.0f64;
    ws.sorted.clear();
    ws.dense.clear();
    for (&c, &x) in indices.iter().zip(values) {
        if x == 0.0 {
            continue;
        }
        match index.columns.get(c) {
            Some(col) => {
                ws.left_stamp[col as usize] = stamp;
                match index.dense_slot[col as usize] {
                    SPARSE => ws.sorted.push((col, x)),
                    slot => ws.dense.push((slot, x)),
                }
            }
            None => outside = outside.max(s.term(x as f64, 0.0)),
        }
    }
    ws.sorted
        .sort_unstable_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));

    let shared = &mut ws.shared[..index.rows];
    let prefix = &mut ws.prefix[..index.rows];
    if !ws.dense.is_empty() {
        dense_max(vectors, s, index, &ws.dense, shared);
    }
    for (t, &(col, x)) in ws.sorted.iter().enumerate() {
        let (start, end) = (index.col_ptr[col as usize], index.col_ptr[col as usize + 1]);
        let x = x as f64;
        for (&j, &y) in index.col_rows[start..end]
            .iter()
            .zip(&index.col_vals[start..end])
        {
            // Branch-free: whether j holds every column so far is data, not predictable.
            let j = j as usize;
            let d = s.term(x, y as f64);
            shared[j] = if d > shared[j] { d } else { shared[j] };
            prefix[j] += (prefix[j] == t as u32) as u32;
        }
    }

    let left_stamp = &ws.left_stamp;
    for j in 0..index.rows {
        let (shared_max, p) = (shared[j], prefix[j] as usize);
        shared[j] = 0.0;
        prefix[j] = 0;
        if !keep.allows(j) {
            continue;
        }
        let mut m = outside.max(shared_max);
        if let Some(&(_, x)) = ws.sorted.get(p) {
            m = m.max(s.term(x as f64, 0.0));
        }
        // The walk only raises m: a row already at the k-th row's distance cannot displace it
        // (rows come in order, so a tie keeps the earlier row), nor one outside the radius get
        // in. On news20 the walk through a long row's common words was most of the join.
        let out_of_reach = match selection {
            Selection::Nearest(_) => m >= topk.filter_bound(),
            Selection::Within(radius) => !within(S::SIMILARITY, m, radius),
        };
        if out_of_reach {
            continue;
        }
        for q in index.row_ptr[j]..index.row_ptr[j + 1] {
            let y = s.term(0.0, index.row_vals[q] as f64);
            if y <= m {
                break;
            }
            if left_stamp[index.row_cols[q] as usize] != stamp {
                m = y;
                break;
            }
        }
        match selection {
            Selection::Nearest(_) => topk.push(m, j as u32),
            Selection::Within(radius) => {
                if within(S::SIMILARITY, m, radius) {
                    out.push(left_row, j as u32, m);
                }
            }
        }
    }
}
