//! Probing the build side with a batch of left rows, on all cores.
//!
//! Per left row, the folded semiring is accumulated over shared columns through the inverted
//! index (a sparse-times-sparse product into a dense accumulator of one value per right row),
//! then every right row is finished and offered to a top-k (or a radius filter). Only k pairs
//! per left row ever exist; the m×n matrix is never materialised.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;

use super::certified::{certified_row, CertifiedScratch};
use super::chebyshev::{chebyshev_row, ChebyshevScratch};
use super::dense_block::{fill_dense_block, Shape};
use super::folded::{folded_row, FoldedScratch};
use super::index::{CpuIndex, CpuKernels};
use super::keep::Keep;
use super::ranges::Ranges;
use super::vectors::Vectors;
use crate::join::{Cancel, PairList, ProbeOptions, Selection, TopK};
use crate::metric::{Reduction, Semiring};
use crate::vector::SparseBatch;

/// Pairs below which consecutive lists are joined into one part: a part becomes a record batch,
/// and a worker's run of rows may be short (the rest of its range taken by another worker).
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
        valid: &[bool],
    ) -> Vec<PairList> {
        probe_with(
            self, index, left, selection, options, cancel, vectors, valid,
        )
    }

    fn dense_block(
        &self,
        index: &CpuIndex,
        left: &SparseBatch,
        out: &mut [f64],
        shape: Shape,
        vectors: Vectors,
    ) {
        fill_dense_block(self, index, left, out, shape, vectors);
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
    let valid = &index.valid;
    index.kernels.probe(
        index,
        left,
        selection,
        options,
        &Cancel::new(),
        vectors,
        valid,
    )
}

#[allow(clippy::too_many_arguments)]
fn probe_with<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    left: &SparseBatch,
    selection: Selection,
    options: ProbeOptions,
    cancel: &Cancel,
    vectors: Vectors,
    valid: &[bool],
) -> Vec<PairList> {
    let ranges = Ranges::new(left.len(), rayon::current_num_threads());
    let lists = Lists::new(index.rows, selection);
    // One worker a thread, each taking its range's rows in order (and, once done, half of the
    // fullest range left): a run of consecutive rows writes one list.
    (0..ranges.workers()).into_par_iter().for_each(|w| {
        let mut ws = Workspace::new::<S>(index);
        let mut run = Run::default();
        // Once cancelled, the remaining rows are not probed (the caller returns an error).
        loop {
            let Some(row) = ranges.next(w).filter(|_| !cancel.is_cancelled()) else {
                lists.done(std::mem::take(&mut run));
                if !cancel.is_cancelled() && ranges.steal(w) {
                    continue;
                }
                break;
            };
            cancel.add_rows(1);
            if run.first.is_none() || lists.full(&run.pairs) {
                // A run's first row, or a list without room for another row: a new list, sized
                // by the pairs a row found so far for the rows the worker holds.
                lists.done(std::mem::take(&mut run));
                run = lists.start(row, ranges.held(w) + 1);
            }
            if left.is_null(row) {
                continue;
            }
            let before = run.pairs.len();
            let keep = Keep {
                valid,
                skip: options.excluded_right_row(row, index.rows),
            };
            let out = &mut run.pairs;
            let left_row = (left.row(row), row as u32);
            probe_row(vectors, s, index, left_row, keep, selection, &mut ws, out);
            lists.found(out.len() - before);
        }
    });
    join_small(lists.into_parts())
}

/// The pairs of a run of consecutive left rows, from `first`.
#[derive(Debug, Default)]
struct Run {
    first: Option<usize>,
    pairs: PairList,
}

/// The lists a probe's workers write, and what sizes them: a list is reserved once for the rows
/// its worker holds, at the pairs a row found so far (plus a quarter), so that a radius join's
/// pairs are written once, into fresh memory of about the right size in huge pages, not grown
/// by copying; a list without room for one more row at the worst case seen so far is ended and
/// a new one started.
struct Lists {
    selection: Selection,
    /// Pairs a left row can have: every right row, or k.
    most_a_row: usize,
    rows_done: AtomicUsize,
    pairs_done: AtomicUsize,
    /// The most pairs one row found.
    most_found: AtomicUsize,
    done: Mutex<Vec<(usize, PairList)>>,
}

/// Pairs a list starts with before any row is done (a radius join's first rows grow it).
const FIRST_LIST_PAIRS: usize = 1 << 16;

impl Lists {
    fn new(right_rows: usize, selection: Selection) -> Self {
        Lists {
            selection,
            most_a_row: match selection {
                Selection::Nearest(k) => k.min(right_rows),
                Selection::Within(_) => right_rows,
            },
            rows_done: AtomicUsize::new(0),
            pairs_done: AtomicUsize::new(0),
            most_found: AtomicUsize::new(0),
            done: Mutex::new(Vec::new()),
        }
    }

    /// A new run from left row `first`, its list reserved for `rows` rows (a knn list for at
    /// most `MIN_PART_PAIRS` pairs: a part becomes a record batch, and small ones cost nothing
    /// to write).
    fn start(&self, first: usize, rows: usize) -> Run {
        let rows = match self.selection {
            Selection::Nearest(k) => rows.min(MIN_PART_PAIRS.div_ceil(k.max(1))),
            Selection::Within(_) => rows,
        };
        let done = self.rows_done.load(Ordering::Relaxed);
        let pairs = if done == 0 {
            FIRST_LIST_PAIRS.min(rows.saturating_mul(self.most_a_row))
        } else {
            let per_row = self.pairs_done.load(Ordering::Relaxed).div_ceil(done);
            let pairs = rows.saturating_mul(per_row);
            (pairs.saturating_add(pairs / 4)).max(self.most_found.load(Ordering::Relaxed))
        };
        Run {
            first: Some(first),
            pairs: PairList::with_capacity(pairs.min(rows.saturating_mul(self.most_a_row))),
        }
    }

    /// Whether `pairs` lacks room for one more row at the most pairs a row found so far.
    fn full(&self, pairs: &PairList) -> bool {
        let room = pairs.capacity() - pairs.len();
        self.rows_done.load(Ordering::Relaxed) > 0 && room < self.most_found.load(Ordering::Relaxed)
    }

    /// A row found `pairs` pairs.
    fn found(&self, pairs: usize) {
        self.pairs_done.fetch_add(pairs, Ordering::Relaxed);
        self.rows_done.fetch_add(1, Ordering::Relaxed);
        self.most_found.fetch_max(pairs, Ordering::Relaxed);
    }

    /// A run is over (a default one, never started, is dropped).
    fn done(&self, run: Run) {
        let Some(first) = run.first else { return };
        let mut pairs = run.pairs;
        pairs.shrink_to_fit();
        self.done
            .lock()
            .expect("no worker panics holding it")
            .push((first, pairs));
    }

    /// Every run's list, in left row order.
    fn into_parts(self) -> Vec<PairList> {
        let mut done = self
            .done
            .into_inner()
            .expect("no worker panicked holding it");
        done.sort_unstable_by_key(|&(first, _)| first);
        done.into_iter().map(|(_, pairs)| pairs).collect()
    }
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

/// One left row (its vector and its number in the batch): its pairs are appended to `out`.
#[allow(clippy::too_many_arguments)]
fn probe_row<S: Semiring>(
    vectors: Vectors,
    s: &S,
    index: &CpuIndex,
    (row, left_row): ((&[i32], &[f32]), u32),
    skip: Keep<'_>,
    selection: Selection,
    ws: &mut Workspace,
    out: &mut PairList,
) {
    let (folded, certified) = (&mut ws.folded, &mut ws.certified);
    if index.union_sum {
        certified_row(
            vectors, s, index, row, left_row, skip, selection, folded, certified, out,
        );
        return;
    }
    if S::REDUCTION == Reduction::Sum {
        folded_row(
            vectors, s, index, row, left_row, skip, selection, folded, out,
        );
        return;
    }
    if let Selection::Nearest(k) = selection {
        ws.topk.reset(k);
    }
    let (topk, chebyshev) = (&mut ws.topk, &mut ws.chebyshev);
    chebyshev_row(
        vectors, s, index, row, left_row, skip, selection, chebyshev, topk, out,
    );
    if let Selection::Nearest(_) = selection {
        for (key, j) in ws.topk.drain_sorted() {
            out.push(left_row, j, key);
        }
    }
}
