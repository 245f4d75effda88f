//! The dense block of distances of a batch of left rows against every right row, for the
//! folded metrics (`pairwise_distances`): each left row's folded sums accumulated over the
//! index as the probe does (`folded::accumulate`'s steps: the same terms in the same order),
//! then every right row finished by the metric's `finish` straight into the caller's array. No
//! pairs: a probe within an infinite radius wrote 16 bytes a pair, then they were copied into
//! the output, two thirds of `pairwise_distances`' time. The values are the probe's, bit for
//! bit (tested below).
//!
//! A block of an index's own rows against themselves ([`dense_block_symmetric`]) computes each
//! pair once, from the earlier row's side, and mirrors the rest: half the work.
//!
//! Tried and left out: accumulating a batch of left rows tile by tile of right rows, so that a
//! tile of the dense columns stays in L2 while each row of the batch adds it (the PBMC cells'
//! 1,336 dense columns are 6.7 MB). On this 2-core machine under other builds it was no faster
//! at any tile size (0.14-0.16 s of CPU for the PBMC graph's probe against 0.14 row by row).

use std::ops::Range;

use datafusion::common::{exec_err, Result};
use rayon::prelude::*;

use super::folded::{add_dense_hits, add_postings, classify, prefetch_next_lists, FoldedScratch};
use super::index::CpuIndex;
use super::int_tiles::{self, IntTiles, LeftPairs};
use super::self_nearest::sums_exact_in_any_order;
use super::vectors::{multiversion, Vectors};
use crate::join::advise_huge_pages_of;
use crate::metric::{with_semiring, Metric, Reduction, RowTotals, Semiring};
use crate::vector::SparseBatch;

/// Bytes of accumulators of one batch (f64 per left row per right row, one or two arrays).
const BATCH_BYTES: usize = 2 << 20;
/// Left rows of a batch at most: a block of few rows still needs batches for every core, and
/// a symmetric block computes the pairs within a batch twice.
const MAX_BATCH: usize = 64;

/// Whether [`dense_block`] computes `metric`: the folded metrics. Chebyshev (a max over the
/// union) and the metrics with an exact union term (minkowski, hellinger, jensenshannon: their
/// folded sums only bound the distance, `certified.rs`) are not.
pub fn fills_dense_block(metric: &Metric) -> bool {
    with_semiring!(metric, s => folded_metric(&s))
}

fn folded_metric<S: Semiring>(s: &S) -> bool {
    S::REDUCTION == Reduction::Sum && !s.has_exact_term()
}

impl CpuIndex {
    /// Whether [`dense_block`] computes this index's metric (see [`fills_dense_block`]).
    pub fn fills_dense_block(&self) -> bool {
        !self.max_reduction && !self.union_sum
    }
}

/// Every distance between the rows of `left` and the rows of `index`, written into `out`: left
/// row r's against right row j at `out[r * stride + j]` (for `dot`, a similarity, the dot
/// product), NaN where either row is NULL. The same values as a probe within an infinite radius
/// (`Selection::Within`), without its pairs; on all cores. An error for a metric it does not
/// compute (see [`fills_dense_block`]) or an `out` too short.
pub fn dense_block(
    index: &CpuIndex,
    left: &SparseBatch,
    out: &mut [f64],
    stride: usize,
) -> Result<()> {
    dense_block_with(index, left, out, stride, false)
}

/// [`dense_block`] of `rows`, the rows `index` was built from, against themselves, for a
/// symmetric metric (every folded metric but kl_divergence): each pair is computed once, with
/// the earlier row on the left, and the block's lower triangle copied from its upper one, so
/// the block is exactly symmetric and takes about half the work. An error where `rows` and the
/// index differ in length (the caller vouches that they are the same rows).
pub fn dense_block_symmetric(
    index: &CpuIndex,
    rows: &SparseBatch,
    out: &mut [f64],
    stride: usize,
) -> Result<()> {
    if rows.len() != index.rows {
        return exec_err!(
            "a symmetric dense block is of the index's own rows: {} rows against {}",
            rows.len(),
            index.rows
        );
    }
    dense_block_with(index, rows, out, stride, true)
}

fn dense_block_with(
    index: &CpuIndex,
    left: &SparseBatch,
    out: &mut [f64],
    stride: usize,
    symmetric: bool,
) -> Result<()> {
    let (rows, n) = (left.len(), index.rows);
    if !index.fills_dense_block() {
        return exec_err!(
            "a dense block of distances computes the folded metrics only; chebyshev, \
             minkowski, hellinger and jensenshannon come from their union terms (probe them)"
        );
    }
    if stride < n || (rows > 0 && out.len() < (rows - 1) * stride + n) {
        return exec_err!(
            "a dense block of {rows} x {n} distances needs a stride of at least {n} and \
             {} values, got a stride of {stride} and {} values",
            (rows.max(1) - 1) * stride + n,
            out.len()
        );
    }
    if rows == 0 {
        return Ok(());
    }
    // Written once, in parallel: 2 MiB pages take a fault where 4 KiB ones took 512 (the
    // faults of a fresh 800 MB block, one per 4 KiB, cost as much as its distances).
    let out = &mut out[..(rows - 1) * stride + n];
    advise_huge_pages_of(out);
    let shape = Shape {
        stride,
        symmetric,
        rows: 0..rows,
        any_order: false,
    };
    index
        .kernels
        .dense_block(index, left, out, shape, Vectors::chosen());
    if symmetric {
        mirror(out, rows, stride);
    }
    Ok(())
}

/// What a dense block fills: the left rows `rows` (the first at the start of `out`, rows
/// `stride` apart), and whether the left rows are the index's own (`symmetric`: each batch from
/// its first row on, the pairs before it left to the caller).
/// `any_order`: the caller vouches that every sum is exact in any order (integer values, see
/// `self_nearest`), so the dense columns may be added in the order fastest here
/// ([`add_dense_tiles`]) rather than the probe's.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub stride: usize,
    pub symmetric: bool,
    pub rows: Range<usize>,
    pub any_order: bool,
}

/// [`dense_block`] for the metric `S` (reached through `CpuKernels`), its arguments checked.
pub(crate) fn fill_dense_block<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    left: &SparseBatch,
    out: &mut [f64],
    shape: Shape,
    vectors: Vectors,
) {
    let Shape {
        stride,
        symmetric,
        rows: span,
        any_order,
    } = shape;
    if span.is_empty() {
        return;
    }
    // A block of the index's own rows whose sums are exact in any order (raw counts, for the
    // metrics named there) takes the dense columns' tiles too: its values are the same.
    let any_order = any_order || (symmetric && sums_exact_in_any_order(S::NAME, left));
    // Batches small enough that every core gets several (the rows' costs differ).
    let threads = rayon::current_num_threads().max(1);
    let batch = batch_rows::<S>(index)
        .min(span.len().div_ceil(4 * threads))
        .max(1);
    let right = RightRows::new(index);
    // Raw counts take 16-bit tiles where the CPU multiplies them (derived once, before the
    // batches wait on it), their sums times the pair's constant.
    let ints = s
        .pair_scale()
        .filter(|_| any_order && int_tiles::available())
        .and_then(|scale| Some((index.int_tiles()?, scale)));
    out.par_chunks_mut(batch * stride)
        .enumerate()
        .for_each_init(
            || BatchScratch::new::<S>(index, batch),
            |ws, (c, out)| {
                let first = span.start + c * batch;
                let rows = first..(first + batch).min(span.end);
                let how = (stride, symmetric, any_order);
                block_batch(vectors, s, index, left, rows, &right, ints, ws, out, how);
            },
        );
}

/// A symmetric block's lower triangle (row i's distances to the rows before it) copied from its
/// upper one, in squares that stay in cache (a copy row by row reads a column of `out`, one
/// cache line per value); bands of rows on all cores (on one, it was 7% of a news20 block's
/// samples, all of them after the parallel part).
pub(crate) fn mirror(out: &mut [f64], n: usize, stride: usize) {
    // (a square read and one written fit L1 together: 2 × 32² × 8 bytes)
    const SQUARE: usize = 32;
    assert!(n == 0 || out.len() >= (n - 1) * stride + n);
    /// The block's start, shared by the bands: each writes only its own rows' lower triangle
    /// and reads only upper triangles, which no band writes.
    #[derive(Clone, Copy)]
    struct Block(*mut f64);
    // SAFETY: see above; the pointer outlives the bands (they end before `mirror` returns).
    unsafe impl Send for Block {}
    unsafe impl Sync for Block {}
    impl Block {
        /// Through a method, so that a closure captures the `Block` (Send), not its pointer.
        fn at(&self, i: usize) -> *mut f64 {
            self.0.wrapping_add(i)
        }
    }
    let block = Block(out.as_mut_ptr());
    (0..n.div_ceil(SQUARE)).into_par_iter().for_each(|band| {
        let i0 = band * SQUARE;
        for j0 in (0..=i0).step_by(SQUARE) {
            for i in i0..(i0 + SQUARE).min(n) {
                for j in j0..(j0 + SQUARE).min(i) {
                    // SAFETY: j < i < n, both inside `out` (asserted above); (i, j) is this
                    // band's, (j, i) is an upper value no band writes.
                    unsafe { *block.at(i * stride + j) = *block.at(j * stride + i) };
                }
            }
        }
    });
}

/// Left rows per batch for `index` (at least one).
fn batch_rows<S: Semiring>(index: &CpuIndex) -> usize {
    let arrays = if S::TWO_ACCUMULATORS { 2 } else { 1 };
    (BATCH_BYTES / (index.rows * 8 * arrays).max(1)).clamp(1, MAX_BATCH)
}

/// What finishing a distance reads of the right rows: their totals apart (so the finishing
/// loop reads contiguous values and vectorises, as `select_within`'s does) and the NULL rows.
struct RightRows {
    t0: Vec<f64>,
    t1: Vec<f64>,
    nulls: Vec<usize>,
}

impl RightRows {
    fn new(index: &CpuIndex) -> Self {
        let (t0, t1) = index.totals.iter().map(|t| (t.t0, t.t1)).unzip();
        let nulls = (0..index.rows).filter(|&j| !index.valid[j]).collect();
        RightRows { t0, t1, nulls }
    }
}

/// One worker's batch: the left rows' hits and accumulators.
struct BatchScratch {
    /// Left rows in the batch now.
    count: usize,
    /// `count` × right rows each (acc1 only for a metric with two accumulators).
    acc0: Vec<f64>,
    acc1: Vec<f64>,
    totals: Vec<RowTotals>,
    null: Vec<bool>,
    /// The batch's left rows' dense hits (slot, x) and sparse hits (column, x), row after row;
    /// row b's are `dense[dense_at[b]..dense_at[b + 1]]`.
    dense: Vec<(u32, f32)>,
    dense_at: Vec<usize>,
    sparse: Vec<(u32, f32)>,
    sparse_at: Vec<usize>,
    row: FoldedScratch,
    /// [`add_dense_tiles`]' tile of the dense columns, in f64.
    tile: Vec<f64>,
    /// The dense hits as pairs of 16-bit values, for `int_tiles::add_tiles`.
    pairs: LeftPairs,
}

impl BatchScratch {
    fn new<S: Semiring>(index: &CpuIndex, batch: usize) -> Self {
        BatchScratch {
            count: 0,
            acc0: vec![0.0; batch * index.rows],
            acc1: if S::TWO_ACCUMULATORS {
                vec![0.0; batch * index.rows]
            } else {
                Vec::new()
            },
            totals: Vec::with_capacity(batch),
            null: Vec::with_capacity(batch),
            dense: Vec::new(),
            dense_at: Vec::with_capacity(batch + 1),
            sparse: Vec::new(),
            sparse_at: Vec::with_capacity(batch + 1),
            row: FoldedScratch::default(),
            tile: Vec::new(),
            pairs: LeftPairs::default(),
        }
    }

    /// The loaded rows' dense hits as pairs of 16-bit values; false where one does not fit
    /// (see `int_tiles`).
    fn load_pairs(&mut self, index: &CpuIndex) -> bool {
        let slots = index.dense_vals.len() / index.rows.max(1);
        let (dense, at) = (&self.dense, &self.dense_at);
        let rows = (0..self.count).map(|b| &dense[at[b]..at[b + 1]]);
        self.pairs.load(slots, rows)
    }

    /// The left rows `rows` classified (their accumulators as they were).
    #[inline(always)]
    fn load<S: Semiring>(
        &mut self,
        s: &S,
        index: &CpuIndex,
        left: &SparseBatch,
        rows: Range<usize>,
    ) {
        self.count = rows.len();
        self.totals.clear();
        self.null.clear();
        self.dense.clear();
        self.sparse.clear();
        self.dense_at.clear();
        self.sparse_at.clear();
        self.dense_at.push(0);
        self.sparse_at.push(0);
        for r in rows {
            let null = left.is_null(r);
            self.null.push(null);
            if null {
                self.totals.push(RowTotals::default());
            } else {
                self.totals
                    .push(classify(s, index, left.row(r), &mut self.row));
                // Coded dense columns belong to certified metrics, which never come here.
                debug_assert!(self.row.coded_hits.is_empty());
                self.dense.extend_from_slice(&self.row.dense_hits);
                self.sparse.extend_from_slice(&self.row.sparse_hits);
            }
            self.dense_at.push(self.dense.len());
            self.sparse_at.push(self.sparse.len());
        }
    }

    /// The loaded rows' accumulators of the right rows from `from` on, zeroed.
    fn zero_accumulators<S: Semiring>(&mut self, n: usize, from: usize) {
        for b in 0..self.count {
            self.acc0[b * n + from..(b + 1) * n].fill(0.0);
            if S::TWO_ACCUMULATORS {
                self.acc1[b * n + from..(b + 1) * n].fill(0.0);
            }
        }
    }
}

/// Step 1 for a batch of left rows: `ws.acc0[b * n + j]` (and `acc1`) get left row b's folded
/// sum with right row j, for the right rows from `from`: each row's dense columns four at a time,
/// then its posting lists, as `folded::accumulate` adds them.
#[inline(always)]
fn accumulate_batch<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    left: &SparseBatch,
    (rows, from, any_order): (Range<usize>, usize, bool),
    ints: Option<(&IntTiles, f64)>,
    ws: &mut BatchScratch,
) {
    ws.load(s, index, left, rows);
    let n = index.rows;
    let tiles = any_order && !S::LIFTED && !S::TWO_ACCUMULATORS;
    if tiles {
        match ints {
            Some((ints, scale)) if ws.load_pairs(index) => {
                int_tiles::add_tiles(ints, &ws.pairs, from..n, &mut ws.acc0, scale)
            }
            _ => {
                ws.zero_accumulators::<S>(n, from);
                add_dense_tiles(s, index, ws, from)
            }
        }
    } else {
        ws.zero_accumulators::<S>(n, from);
    }
    for b in 0..ws.count {
        if !tiles {
            let (acc0, acc1) = row_accs::<S>(&mut ws.acc0, &mut ws.acc1, b * n, from..n);
            let dense = &ws.dense[ws.dense_at[b]..ws.dense_at[b + 1]];
            add_dense_hits(s, index, dense, from..n, acc0, acc1);
        }
        // Postings of right rows before `from` are passed over: a list's rows increase, so
        // counting those before `from` finds where they end (`postings_before`).
        let (acc0, acc1) = row_accs::<S>(&mut ws.acc0, &mut ws.acc1, b * n, 0..n);
        let hits = &ws.sparse[ws.sparse_at[b]..ws.sparse_at[b + 1]];
        for (h, &(col, x)) in hits.iter().enumerate() {
            prefetch_next_lists::<S>(index, hits, h);
            let (mut start, end) = (index.col_ptr[col as usize], index.col_ptr[col as usize + 1]);
            if from > 0 {
                start += postings_before(&index.col_rows[start..end], from);
            }
            let postings = start..end;
            add_postings(s, index, (col, x), postings, 0, acc0, acc1);
        }
    }
}

/// How many of a posting list's rows (increasing) are before `from`: a short list counted
/// with vector compares, a long one searched. The binary search's dependent loads (each a miss
/// in a list not yet read) were a fifth of the PBMC graph's batches; a short list's lines are
/// read by its postings just after.
#[inline(always)]
fn postings_before(rows: &[u32], from: usize) -> usize {
    if rows.len() <= 256 {
        let from = from as u32;
        rows.iter().map(|&j| (j < from) as usize).sum()
    } else {
        rows.partition_point(|&j| (j as usize) < from)
    }
}

/// Right rows whose sums a tile of [`add_dense_tiles`] keeps in registers (four AVX-512
/// registers of f64 each).
const TILE: usize = 32;

/// The dense columns' terms of every left row of the batch, written to its accumulators (which
/// hold zeros) for the right rows from `from` on, in an order of its own: a tile of right rows
/// at a time, its slice of every dense column widened to f64 once for the batch, then each
/// left row's sums over the tile kept in registers across all of its dense hits and stored
/// once (a pair c·x·y as one fused multiply-add). `add_dense_hits` streams every hit's whole
/// column through the accumulators in memory, widening each value again for each left row.
/// The terms are added hit after hit, where the probe adds them four at a time: the same sums
/// only where every sum is exact in any order (`Shape::any_order`; there a fused multiply-add
/// is exact too). Metrics with a lift or a second accumulator take `add_dense_hits`.
#[inline(always)]
fn add_dense_tiles<S: Semiring>(s: &S, index: &CpuIndex, ws: &mut BatchScratch, from: usize) {
    let n = index.rows;
    let slots = index.dense_vals.len() / n.max(1);
    let (scale, prm) = (s.pair_scale(), s.params());
    ws.tile.resize(slots * TILE, 0.0);
    let mut j0 = from;
    while j0 < n {
        let len = TILE.min(n - j0);
        // (past the last row: zeros, whose pairs vanish)
        for (slot, tile) in ws.tile.chunks_exact_mut(TILE).enumerate() {
            let column = &index.dense_vals[slot * n + j0..slot * n + j0 + len];
            for (t, &y) in tile.iter_mut().zip(column) {
                *t = y as f64;
            }
            tile[len..].fill(0.0);
        }
        for b in 0..ws.count {
            let hits = &ws.dense[ws.dense_at[b]..ws.dense_at[b + 1]];
            if hits.is_empty() {
                continue;
            }
            let sums = match scale {
                Some(c) => tile_sums(&ws.tile, hits, |x, y, sum| (c * x).mul_add(y, sum)),
                None => tile_sums(&ws.tile, hits, |x, y, sum| {
                    // (a select, not a branch: the tile's loop vectorises)
                    let keep = S::PAIR_VANISHES || y != 0.0;
                    sum + if keep {
                        S::pair0(x, y, 0.0, 0.0, &prm)
                    } else {
                        0.0
                    }
                }),
            };
            let at = b * n + j0;
            ws.acc0[at..at + len].copy_from_slice(&sums[..len]);
        }
        j0 += len;
    }
}

/// Each tile row's sum over `hits` (a left row's dense hits, x) of the pairs with its value y
/// (`tile`, slot-major), `add(x, y, sum)` adding one.
#[inline(always)]
fn tile_sums(tile: &[f64], hits: &[(u32, f32)], add: impl Fn(f64, f64, f64) -> f64) -> [f64; TILE] {
    // Four registers' worth of lanes, each its own array: one array of 32 was cut into
    // vectors of odd widths and kept partly on the stack.
    let mut sums = [[0.0f64; LANES]; TILE / LANES];
    for &(slot, x) in hits {
        let x = x as f64;
        let ys = &tile[slot as usize * TILE..][..TILE];
        for (sum, ys) in sums.iter_mut().zip(ys.chunks_exact(LANES)) {
            for l in 0..LANES {
                sum[l] = add(x, ys[l], sum[l]);
            }
        }
    }
    let mut out = [0.0f64; TILE];
    for (out, sum) in out.chunks_exact_mut(LANES).zip(&sums) {
        out.copy_from_slice(sum);
    }
    out
}

/// f64 lanes of an AVX-512 register.
const LANES: usize = 8;

/// Left row b's accumulators of the right rows `j`, from the batch's arrays (`at` = b × n).
#[inline(always)]
fn row_accs<'a, S: Semiring>(
    acc0: &'a mut [f64],
    acc1: &'a mut [f64],
    at: usize,
    j: Range<usize>,
) -> (&'a mut [f64], &'a mut [f64]) {
    let acc0 = &mut acc0[at + j.start..at + j.end];
    let acc1: &mut [f64] = if S::TWO_ACCUMULATORS {
        &mut acc1[at + j.start..at + j.end]
    } else {
        &mut []
    };
    (acc0, acc1)
}

multiversion! {
    /// One batch of a dense block: left rows `rows`, written to `out` (the batch's first row at
    /// its start, rows `stride` apart).
    fn block_batch<S: Semiring>(
        s: &S,
        index: &CpuIndex,
        left: &SparseBatch,
        rows: Range<usize>,
        right: &RightRows,
        ints: Option<(&IntTiles, f64)>,
        ws: &mut BatchScratch,
        out: &mut [f64],
        how: (usize, bool, bool),
    ) => block_batch_impl;
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block_batch_impl<S: Semiring>(
    s: &S,
    index: &CpuIndex,
    left: &SparseBatch,
    rows: Range<usize>,
    right: &RightRows,
    ints: Option<(&IntTiles, f64)>,
    ws: &mut BatchScratch,
    out: &mut [f64],
    (stride, symmetric, any_order): (usize, bool, bool),
) {
    // A symmetric block's batch needs the right rows from its own first row on.
    let from = if symmetric { rows.start } else { 0 };
    accumulate_batch(s, index, left, (rows, from, any_order), ints, ws);
    let n = index.rows;
    let (t0, t1) = (&right.t0[from..n], &right.t1[from..n]);
    let m = n - from;
    for b in 0..ws.count {
        let out = &mut out[b * stride + from..b * stride + n];
        if ws.null[b] {
            out.fill(f64::NAN);
            continue;
        }
        let totals = &ws.totals[b];
        let acc0 = &ws.acc0[b * n + from..(b + 1) * n];
        if S::TWO_ACCUMULATORS {
            let acc1 = &ws.acc1[b * n + from..(b + 1) * n];
            for j in 0..m {
                let r = RowTotals {
                    t0: t0[j],
                    t1: t1[j],
                };
                out[j] = s.finish(acc0[j], acc1[j], totals, &r);
            }
        } else {
            for j in 0..m {
                let r = RowTotals {
                    t0: t0[j],
                    t1: t1[j],
                };
                out[j] = s.finish(acc0[j], 0.0, totals, &r);
            }
        }
        for &j in right.nulls.iter().filter(|&&j| j >= from) {
            out[j - from] = f64::NAN;
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::cpu::folded::folded_row;
    use crate::join::{PairList, ProbeOptions, Selection};
    use crate::metric::MetricKind;

    const DIM: i32 = 300;

    /// Rows whose first `hot` columns are each held by a third to a half of the rows (dense in
    /// the index), the rest a long tail (postings); small integers and fractions, so that
    /// distances tie; row 3 and the last row NULL.
    fn batch(rng: &mut StdRng, n: usize, hot: i32) -> SparseBatch {
        let rows: Vec<Option<Vec<(i32, f32)>>> = (0..n)
            .map(|r| {
                if r == 3 || r == n - 1 {
                    return None;
                }
                let mut row = Vec::new();
                for c in 0..DIM {
                    let p = if c < hot {
                        0.5 - c as f64 / 600.0
                    } else {
                        2.0 / c as f64
                    };
                    if rng.random_bool(p.min(1.0)) {
                        let v = if rng.random_bool(0.5) {
                            rng.random_range(1..4) as f32
                        } else {
                            rng.random_range(0.05f32..3.0)
                        };
                        row.push((c, v));
                    }
                }
                Some(row)
            })
            .collect();
        SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()))
    }

    fn metrics() -> Vec<Metric> {
        MetricKind::all()
            .map(|k| Metric::from_kind(k, None, Some(DIM as u64)).unwrap())
            .collect()
    }

    /// The row-at-a-time kernel's pairs of every left row (the reference).
    fn by_row<S: Semiring>(
        s: &S,
        index: &CpuIndex,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
    ) -> PairList {
        let mut ws = FoldedScratch::new(index.rows, S::TWO_ACCUMULATORS);
        let mut out = PairList::default();
        for r in (0..left.len()).filter(|&r| !left.is_null(r)) {
            let skip = super::super::keep::Keep {
                valid: &index.valid,
                skip: options.excluded_right_row(r, index.rows),
            };
            let v = Vectors::chosen();
            folded_row(
                v,
                s,
                index,
                left.row(r),
                r as u32,
                skip,
                selection,
                &mut ws,
                &mut out,
            );
        }
        out
    }

    /// The dense block holds a probe's distances within an infinite radius (every pair), bit
    /// for bit, NaN for NULL rows; and agrees with the metric's definition row by row.
    #[test]
    fn dense_block_holds_every_pairs_distance() {
        let mut rng = StdRng::seed_from_u64(7);
        let right = batch(&mut rng, 280, 30);
        let left = batch(&mut rng, 50, 30);
        let (n, m, stride) = (left.len(), right.len(), right.len() + 3);
        for metric in metrics() {
            let index = CpuIndex::build(&right, &metric);
            if !index.fills_dense_block() {
                let mut out = vec![0.0; n * stride];
                let err = dense_block(&index, &left, &mut out, stride).unwrap_err();
                assert!(err.to_string().contains("folded metrics only"), "{err}");
                continue;
            }
            let mut out = vec![-7.0; n * stride];
            dense_block(&index, &left, &mut out, stride).unwrap();
            let everything = if metric.kind.is_similarity() {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            };
            let pairs = with_semiring!(metric, s => {
                by_row(&s, &index, &left, Selection::Within(everything), ProbeOptions::default())
            });
            let mut want = vec![f64::NAN; n * stride];
            for r in 0..n {
                want[r * stride + m..(r + 1) * stride].fill(-7.0);
            }
            for i in 0..pairs.len() {
                want[pairs.left[i] as usize * stride + pairs.right[i] as usize] = pairs.distance[i];
            }
            let as_bits = |v: &[f64]| v.iter().map(|d| d.to_bits()).collect::<Vec<_>>();
            assert_eq!(as_bits(&out), as_bits(&want), "{metric}");
            for (r, j) in [(0, 0), (1, 2), (2, 279), (10, 3), (49, 5), (20, 100)] {
                let d = out[r * stride + j];
                if left.is_null(r) || right.is_null(j) {
                    assert!(d.is_nan(), "{metric} ({r}, {j}): {d}");
                    continue;
                }
                let exact = metric.distance(left.row(r), right.row(j));
                let close = d == exact || (d - exact).abs() <= 1e-9 * exact.abs().max(1.0);
                assert!(close, "{metric} ({r}, {j}): {d} against {exact}");
            }
        }
    }

    /// The symmetric block of an index's own rows: exactly symmetric, and each value the plain
    /// block's up to rounding (the same terms, summed from the other row's side), NaN for the
    /// NULL rows; for every symmetric folded metric.
    #[test]
    fn symmetric_block_is_the_plain_block_mirrored() {
        let mut rng = StdRng::seed_from_u64(11);
        let rows = batch(&mut rng, 290, 30);
        let (n, stride) = (rows.len(), rows.len() + 1);
        for metric in metrics() {
            let index = CpuIndex::build(&rows, &metric);
            if !index.fills_dense_block() || metric.kind == MetricKind::KlDivergence {
                continue;
            }
            let mut plain = vec![0.0; n * stride];
            dense_block(&index, &rows, &mut plain, stride).unwrap();
            let mut sym = vec![-1.0; n * stride];
            dense_block_symmetric(&index, &rows, &mut sym, stride).unwrap();
            for i in 0..n {
                assert_eq!(sym[i * stride + n], -1.0, "{metric}: past the row");
                for j in 0..n {
                    let (d, t, p) = (
                        sym[i * stride + j],
                        sym[j * stride + i],
                        plain[i * stride + j],
                    );
                    assert_eq!(d.to_bits(), t.to_bits(), "{metric} ({i}, {j})");
                    let same =
                        (d.is_nan() && p.is_nan()) || (d - p).abs() <= 1e-12 * p.abs().max(1.0);
                    assert!(same, "{metric} ({i}, {j}): {d} against {p}");
                }
            }
        }
        let index = CpuIndex::build(&rows, &Metric::new("cosine", None, None).unwrap());
        let mut out = vec![0.0; n * n];
        let err = dense_block_symmetric(&index, &rows.slice(0, 9), &mut out, n).unwrap_err();
        assert!(
            err.to_string().contains("own rows: 9 rows against 290"),
            "{err}"
        );
    }

    /// On counts (in the thousands; each sum exact in any order) the symmetric block takes the
    /// dense columns in tiles of its own order and still holds the plain block's values bit for
    /// bit, whole tiles and cut ones, for the metrics whose sums are exact there.
    #[test]
    fn symmetric_block_of_counts_is_the_plain_block_bit_for_bit() {
        let mut rng = StdRng::seed_from_u64(13);
        let fractions = batch(&mut rng, 301, 30);
        let rows: Vec<Option<Vec<(i32, f32)>>> = (0..fractions.len())
            .map(|r| {
                let (idx, val) = fractions.row(r);
                let row = idx.iter().zip(val);
                let row = row.map(|(&c, &v)| (c, (v * 997.0).ceil())).collect();
                (!fractions.is_null(r)).then_some(row)
            })
            .collect();
        let counts = SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()));
        let n = counts.len();
        for name in ["cosine", "euclidean", "sqeuclidean", "manhattan"] {
            let metric = Metric::new(name, None, None).unwrap();
            assert!(sums_exact_in_any_order(name, &counts));
            let index = CpuIndex::build(&counts, &metric);
            assert!(!index.dense_vals.is_empty(), "dense columns in the index");
            let mut plain = vec![0.0; n * n];
            dense_block(&index, &counts, &mut plain, n).unwrap();
            let mut sym = vec![0.0; n * n];
            dense_block_symmetric(&index, &counts, &mut sym, n).unwrap();
            let bits = |v: &[f64]| v.iter().map(|d| d.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&sym), bits(&plain), "{name}");
        }
    }

    #[test]
    fn dense_block_needs_room_for_every_row() {
        let mut rng = StdRng::seed_from_u64(1);
        let right = batch(&mut rng, 40, 5);
        let left = batch(&mut rng, 6, 5);
        let index = CpuIndex::build(&right, &Metric::new("cosine", None, None).unwrap());
        let mut out = vec![0.0; 6 * 40 - 1];
        let err = dense_block(&index, &left, &mut out, 40).unwrap_err();
        assert!(
            err.to_string().contains("needs a stride of at least 40"),
            "{err}"
        );
        let err = dense_block(&index, &left, &mut vec![0.0; 6 * 40], 39).unwrap_err();
        assert!(err.to_string().contains("got a stride of 39"), "{err}");
    }
}
