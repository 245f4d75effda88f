//! Probing the build side with a batch of left rows, on all cores.
//!
//! Per left row, the folded semiring is accumulated over shared columns through the inverted
//! index (a sparse-times-sparse product into a dense accumulator of one value per right row),
//! then every right row is finished and offered to a top-k (or a radius filter). Only k pairs
//! per left row ever exist; the m×n matrix is never materialised.

use rayon::prelude::*;

use super::certified::{certified_row, CertifiedScratch};
use super::chebyshev::{chebyshev_row, ChebyshevScratch};
use super::folded::{folded_row, FoldedScratch};
use super::index::{CpuIndex, CpuKernels};
use super::vectors::Vectors;
use crate::join::{within, Cancel, PairList, ProbeOptions, Selection, TopK};
use crate::metric::{Reduction, Semiring};
use crate::vector::SparseBatch;

/// Rows per parallel task: small enough to balance skewed degrees across cores.
const ROWS_PER_TASK: usize = 8;

/// Pairs below which consecutive tasks' lists are joined into one part: a part becomes a record
/// batch, and a knn task's 8 rows make only 8k pairs.
const MIN_PART_PAIRS: usize = 1 << 16;

impl<S: Semiring> CpuKernels for S {
    fn probe(
        &self,
        index: &CpuIndex,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        vectors: Vectors,
    ) -> Vec<PairList> {
        probe_with(self, index, left, selection, options, cancel, vectors)
    }
}

/// Every pair of `left` against `index` that `selection` keeps.
pub fn probe(
    index: &CpuIndex,
    left: &SparseBatch,
    selection: Selection,
    options: ProbeOptions,
) -> PairList {
    PairList::concat(probe_parts(index, left, selection, options))
}

/// [`probe`]'s pairs as the operator takes them: consecutive lists of whole left rows, in left
/// row order, each of at least `MIN_PART_PAIRS` pairs but the last (a large one as its task
/// wrote it, not copied again).
pub fn probe_parts(
    index: &CpuIndex,
    left: &SparseBatch,
    selection: Selection,
    options: ProbeOptions,
) -> Vec<PairList> {
    probe_parts_with(index, left, selection, options, Vectors::chosen())
}

/// [`probe_parts`] on the given vector instructions (at most those the CPU has): every width
/// gives the same bits.
pub(crate) fn probe_parts_with(
    index: &CpuIndex,
    left: &SparseBatch,
    selection: Selection,
    options: ProbeOptions,
    vectors: Vectors,
) -> Vec<PairList> {
    index
        .kernels
        .probe(index, left, selection, options, &Cancel::new(), vectors)
}

fn probe_with<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    left: &SparseBatch,
    selection: Selection,
    options: ProbeOptions,
    cancel: &Cancel,
    vectors: Vectors,
) -> Vec<PairList> {
    let rows = left.len();
    let chunks: Vec<PairList> = (0..rows.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .map_init(
            || Workspace::new::<S>(index),
            |ws, chunk| {
                let start = chunk * ROWS_PER_TASK;
                let end = (start + ROWS_PER_TASK).min(rows);
                let mut out = PairList::default();
                // Once cancelled, the remaining tasks do nothing (the caller returns an error).
                if cancel.is_cancelled() {
                    return out;
                }
                cancel.add_rows(end - start);
                for row in start..end {
                    if left.is_null(row) {
                        continue;
                    }
                    let skip = options.excluded_right_row(row, index.rows);
                    if index.union_sum {
                        certified_row(
                            vectors,
                            s,
                            index,
                            left.row(row),
                            row as u32,
                            skip,
                            selection,
                            &mut ws.folded,
                            &mut ws.certified,
                            &mut out,
                        );
                    } else {
                        probe_row(
                            vectors,
                            s,
                            index,
                            left.row(row),
                            row as u32,
                            skip,
                            selection,
                            ws,
                            &mut out,
                        );
                    }
                }
                out
            },
        )
        .collect();
    join_small(chunks)
}

/// Consecutive lists joined until each holds at least `MIN_PART_PAIRS` (the last may hold
/// fewer); a list that large on its own is kept as it is.
fn join_small(lists: Vec<PairList>) -> Vec<PairList> {
    let mut parts = Vec::new();
    let mut pending: Vec<PairList> = Vec::new();
    let mut pending_pairs = 0;
    for list in lists {
        if list.is_empty() {
            continue;
        }
        if list.len() >= MIN_PART_PAIRS && !pending.is_empty() {
            parts.push(PairList::concat(std::mem::take(&mut pending)));
            pending_pairs = 0;
        }
        pending_pairs += list.len();
        pending.push(list);
        if pending_pairs >= MIN_PART_PAIRS {
            parts.push(PairList::concat(std::mem::take(&mut pending)));
            pending_pairs = 0;
        }
    }
    if !pending.is_empty() {
        parts.push(PairList::concat(pending));
    }
    parts
}

/// Per-thread scratch, reused across rows.
struct Workspace {
    folded: FoldedScratch,
    chebyshev: ChebyshevScratch,
    certified: CertifiedScratch,
    topk: TopK,
}

impl Workspace {
    fn new<S: Semiring>(index: &CpuIndex) -> Self {
        if S::REDUCTION == Reduction::Max {
            return Workspace {
                folded: FoldedScratch::default(),
                chebyshev: ChebyshevScratch::new(index),
                certified: CertifiedScratch::default(),
                topk: TopK::default(),
            };
        }
        Workspace {
            folded: FoldedScratch::new(index.rows, S::TWO_ACCUMULATORS),
            chebyshev: ChebyshevScratch::default(),
            certified: CertifiedScratch::default(),
            topk: TopK::default(),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn probe_row<S: Semiring>(
    vectors: Vectors,
    s: &S,
    index: &CpuIndex,
    row: (&[i32], &[f32]),
    left_row: u32,
    skip: Option<usize>,
    selection: Selection,
    ws: &mut Workspace,
    out: &mut PairList,
) {
    if S::REDUCTION == Reduction::Sum {
        folded_row(
            vectors,
            s,
            index,
            row,
            left_row,
            skip,
            selection,
            &mut ws.folded,
            out,
        );
        return;
    }
    if let Selection::Nearest(k) = selection {
        ws.topk.reset(k);
    }
    let topk = &mut ws.topk;
    let offer = |j: usize, d: f64| match selection {
        Selection::Nearest(_) => topk.push(d, j as u32),
        Selection::Within(radius) => {
            if within(S::SIMILARITY, d, radius) {
                out.push(left_row, j as u32, d);
            }
        }
    };
    chebyshev_row(s, index, row, skip, &mut ws.chebyshev, offer);
    if let Selection::Nearest(_) = selection {
        for (key, j) in ws.topk.drain_sorted() {
            out.push(left_row, j, key);
        }
    }
}
