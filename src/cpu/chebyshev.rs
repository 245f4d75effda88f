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

use super::index::CpuIndex;
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
    /// The left row's (column id, x) on the right side's columns, largest |x| first.
    sorted: Vec<(u32, f32)>,
}

impl ChebyshevScratch {
    pub(crate) fn new(index: &CpuIndex) -> Self {
        Self {
            shared: vec![0.0; index.rows],
            prefix: vec![0; index.rows],
            left_stamp: vec![0; index.column_count],
            stamp: 0,
            sorted: Vec::new(),
        }
    }
}

/// Offers every kept right row's distance, in right-row order.
pub(crate) fn chebyshev_row<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    (indices, values): (&[i32], &[f32]),
    skip: Option<usize>,
    ws: &mut ChebyshevScratch,
    mut offer: impl FnMut(usize, f64),
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
    for (&c, &x) in indices.iter().zip(values) {
        if x == 0.0 {
            continue;
        }
        match index.columns.get(c) {
            Some(col) => {
                ws.left_stamp[col as usize] = stamp;
                ws.sorted.push((col, x));
            }
            None => outside = outside.max(s.term(x as f64, 0.0)),
        }
    }
    ws.sorted
        .sort_unstable_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));

    let shared = &mut ws.shared[..index.rows];
    let prefix = &mut ws.prefix[..index.rows];
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
        if !index.valid[j] || skip == Some(j) {
            continue;
        }
        let mut m = outside.max(shared_max);
        if let Some(&(_, x)) = ws.sorted.get(p) {
            m = m.max(s.term(x as f64, 0.0));
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
        offer(j, m);
    }
}
