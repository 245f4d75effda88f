//! The right side prepared on the host for the device: an inverted index cut in tiles (and for a
//! max, each row's largest values and every entry's rank in its row), or, for a right side that
//! stays whole on the device, everything but the index, which the device builds (`lists`).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use datafusion::common::Result;
use rayon::prelude::*;

use super::args::DenseFillArgs;
use super::device::{cuda_err, Device};
use super::kernels::MetricProgram;
use super::lists::ListSource;
use super::memory::{addr, upload, zeros};
use super::stats::GpuStats;
use crate::metric::{KeyForm, RowTotals};
use crate::vector::SparseBatch;

/// Maps a column index to a column id of the right side.
#[derive(Debug, Clone)]
pub(crate) enum ColumnMap {
    /// Ids are the indices themselves, below `len`.
    Direct(usize),
    /// The right side's distinct indices, sorted (hashed n-grams up to 2^31).
    Sorted(Vec<i32>),
}

impl ColumnMap {
    pub(crate) fn get(&self, c: i32) -> Option<u32> {
        match self {
            ColumnMap::Direct(len) => (c >= 0 && (c as usize) < *len).then_some(c as u32),
            ColumnMap::Sorted(ids) => ids.binary_search(&c).ok().map(|i| i as u32),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            ColumnMap::Direct(len) => *len,
            ColumnMap::Sorted(ids) => ids.len(),
        }
    }
}

/// One part of the right side (rows `first_row..first_row + rows`), prepared on the host.
#[derive(Debug, Default)]
pub(crate) struct HostPart {
    pub(crate) first_row: usize,
    pub(crate) rows: usize,
    /// A bit per valid row, or empty when every row is valid ([`valid_bits`]).
    pub(crate) valid_bits: Vec<u32>,
    /// Folded metrics: the right rows' totals, and the range of |y| over the part's nonzeros.
    pub(crate) rt0: Vec<f64>,
    pub(crate) rt1: Vec<f64>,
    /// [`KeyForm::Quotient`]: each right row's filter base (√t0, as the finish computes it);
    /// empty otherwise (the other forms read `rt0` or nothing).
    pub(crate) key_base: Vec<f64>,
    pub(crate) y_min: f64,
    pub(crate) y_max: f64,
    pub(crate) ntiles: usize,
    pub(crate) tile_ptr: Vec<u32>,
    /// The inverted lists' entries, each a right row (low 32 bits) and its value's float bits
    /// (high 32): the kernels read both in one 8-byte load (`list_entry` packs them).
    pub(crate) col_entries: Vec<u64>,
    /// A max (chebyshev): each entry's rank in its row and each row's largest values
    /// ([`max_ranks`]); empty otherwise.
    pub(crate) col_ranks: Vec<u8>,
    pub(crate) r_top: Vec<f32>,
    /// A max whose lists are built on the device: each entry's rank in its row, in the part's
    /// CSR order (the device places them beside the entries).
    pub(crate) entry_ranks: Vec<u8>,
    /// dot and cosine with dense columns ([`DenseColumns`]): the column ids' slots, the dense
    /// block's width (0: no dense columns) and padded rows, and its values' flags; the block
    /// itself (the part's rows in those columns, n_pad x kp, row-major, and its half copy) is
    /// made on the device from the inverted lists (`dense_fill`).
    pub(crate) dense_slot: Vec<i32>,
    pub(crate) dense_kp: usize,
    pub(crate) dense_n_pad: usize,
    pub(crate) dense_flags: u32,
    /// Set when the inverted lists are left for the device to build from the part's rows
    /// ([`super::lists`]): `tile_ptr` and `col_entries` then stay empty here.
    pub(crate) device_lists: Option<DeviceLists>,
}

/// The size of the inverted lists a part leaves for the device to build.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceLists {
    /// Nonzeros of the part: the lists' entries.
    pub(crate) entries: usize,
    pub(crate) ncols: usize,
}

impl HostPart {
    /// The dense block's bytes per value: a float, and its fast copy.
    fn dense_bytes_per_value(&self) -> usize {
        4 + fast_kind(self.dense_flags, self.dense_kp).bytes()
    }

    pub(crate) fn device_bytes(&self) -> u64 {
        (self.dense_n_pad * self.dense_kp * self.dense_bytes_per_value()
            + self.dense_slot.len() * 4
            + self.valid_bits.len() * 4
            + self.rt0.len() * 8
            + self.rt1.len() * 8
            + self.key_base.len() * 8
            + self.tile_ptr.len() * 4
            + self.col_entries.len() * 8
            + self.col_ranks.len()
            + self.r_top.len() * 4
            + self.device_lists.map_or(0, |lists| {
                let ranks = usize::from(!self.entry_ranks.is_empty());
                lists.entries * (8 + ranks) + lists.ncols * (self.ntiles + 1) * 4
            })) as u64
    }
}

/// A part's buffers on the device.
pub(crate) struct DevPart {
    pub(crate) valid_bits: CudaSlice<u32>,
    /// Every row is valid: `valid_bits` holds nothing.
    pub(crate) all_valid: bool,
    pub(crate) rt0: CudaSlice<f64>,
    pub(crate) rt1: CudaSlice<f64>,
    pub(crate) key_base: CudaSlice<f64>,
    pub(crate) tile_ptr: CudaSlice<u32>,
    pub(crate) col_entries: CudaSlice<u64>,
    pub(crate) col_ranks: CudaSlice<u8>,
    pub(crate) r_top: CudaSlice<f32>,
    pub(crate) y_min: f64,
    pub(crate) y_max: f64,
    pub(crate) bytes: u64,
    /// The dense columns' block on the device (see [`HostPart::dense_block`]).
    pub(crate) dense: Option<DevDense>,
}

/// A part's dense columns on the device.
pub(crate) struct DevDense {
    pub(crate) block: CudaSlice<f32>,
    /// `block` as 8-bit integers or half-precision bits, when its values all have them exactly
    /// (see [`FastKind`]).
    pub(crate) fast: Option<CudaSlice<u8>>,
    pub(crate) fast_kind: FastKind,
    pub(crate) slot: CudaSlice<i32>,
    /// Dense columns (padded) and rows (padded) of `block`.
    pub(crate) kp: usize,
    pub(crate) n_pad: usize,
    pub(crate) flags: u32,
}

/// Rows of C = A·Bᵀ per block of `dense_gemm` (the left chunk is padded to it).
pub(crate) const DENSE_TILE_M: usize = 128;
/// Right rows per block of `dense_gemm` (a part's block is padded to it).
pub(crate) const DENSE_TILE_N: usize = 128;
/// Dense columns per step of `dense_gemm` (the block's width is padded to it): 128 bytes of
/// 8-bit values.
pub(crate) const DENSE_TILE_K: usize = 128;
/// A value that is not a TF32 number (float32's low 13 mantissa bits set): the product splits it.
pub(crate) const DENSE_NOT_TF32: u32 = 1;
/// A value that is not an integer of magnitude at most 2048: no half-precision product.
pub(crate) const DENSE_NOT_HALF: u32 = 2;
/// A value that is not an integer of magnitude at most 127: no 8-bit integer product.
pub(crate) const DENSE_NOT_INT8: u32 = 4;
/// Dense columns an 8-bit integer product sums exactly in 32-bit integers: 127² · 133,000 < 2^31.
const MAX_INT8_COLUMNS: usize = 133_000;

/// The fast copy of a dense block, by its values (`DENSE_FAST_*` in kernels/knn.cu): the
/// product runs on it when the left rows' values have it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FastKind {
    None = 0,
    Half = 1,
    Int8 = 2,
}

impl FastKind {
    pub(crate) fn bytes(self) -> usize {
        match self {
            FastKind::None => 0,
            FastKind::Half => 2,
            FastKind::Int8 => 1,
        }
    }
}

/// The fast copy for a block of `kp` columns whose values' flags are `flags`.
pub(crate) fn fast_kind(flags: u32, kp: usize) -> FastKind {
    if flags & DENSE_NOT_INT8 == 0 && kp <= MAX_INT8_COLUMNS {
        FastKind::Int8
    } else if flags & DENSE_NOT_HALF == 0 {
        FastKind::Half
    } else {
        FastKind::None
    }
}

/// 32-bit words per row of `dense_gemm`'s shared-memory tiles: 128 bytes of k, padded by 4
/// words against bank conflicts.
const DENSE_GEMM_LD: usize = 36;
/// Shared memory of `dense_gemm`: two stages of DENSE_TILE_M + DENSE_TILE_N padded rows.
pub(crate) const DENSE_GEMM_SMEM: u32 =
    (2 * (DENSE_TILE_M + DENSE_TILE_N) * DENSE_GEMM_LD * 4) as u32;

/// The dense product's constants as the kernels read them (kernels/knn.cu), so the two sides
/// cannot drift.
pub(crate) fn dense_defines() -> String {
    format!(
        "#define DG_BM {DENSE_TILE_M}\n#define DG_BN {DENSE_TILE_N}\n#define DG_LD {DENSE_GEMM_LD}\n\
         #define DENSE_NOT_TF32 {DENSE_NOT_TF32}u\n#define DENSE_NOT_HALF {DENSE_NOT_HALF}u\n\
         #define DENSE_NOT_INT8 {DENSE_NOT_INT8}u\n#define DENSE_FAST_HALF {}\n\
         #define DENSE_FAST_INT8 {}\n",
        FastKind::Half as i32,
        FastKind::Int8 as i32,
    )
}

/// Device bytes per left row of a launch's dense product: its row of A and of A's fast copy
/// (`kp` columns), and its row of C (`n_pad` right rows).
pub(crate) fn dense_bytes_per_left_row(kp: usize, fast: FastKind, n_pad: usize) -> u64 {
    (kp * (4 + fast.bytes()) + n_pad * 4) as u64
}

/// The flags of one value (as `dense_flags` in kernels/knn.cu): not a TF32 number; not a whole
/// number of at most 2048 in size (half precision holds those exactly); not one of at most 127
/// (8 bits). Without branches or `round` (a library call on baseline x86-64), so that a loop
/// over a column's values is vectorised: a value of at most 2048 in size is whole exactly when
/// truncating it to an integer gives it back.
#[inline]
pub(crate) fn dense_flags(v: f32) -> u32 {
    let size = v.abs();
    let small = size <= 2048.0;
    let t = if small { v } else { 0.0 };
    let whole_small = small && (t as i32) as f32 == t;
    (u32::from(v.to_bits() & 0x1fff != 0) * DENSE_NOT_TF32)
        | (u32::from(!whole_small) * DENSE_NOT_HALF)
        | (u32::from(!(whole_small && size <= 127.0)) * DENSE_NOT_INT8)
}

/// Values of a dense column must lie in [2^-40, 2^40] (or be 0): their float32 products and
/// sums then neither underflow nor overflow. A column with others stays sparse; a left chunk
/// with others runs without the product.
pub(crate) const DENSE_MIN_ABS: f32 = 9.094947e-13; // 2^-40
pub(crate) const DENSE_MAX_ABS: f32 = 1.0995116e12; // 2^40

/// Whether `v` is within the dense product's range (see [`DENSE_MIN_ABS`]).
pub(crate) fn dense_value_ok(v: f32) -> bool {
    v == 0.0 || (DENSE_MIN_ABS..=DENSE_MAX_ABS).contains(&v.abs())
}

/// The columns of the right side that the tensor cores take as a dense block (dot, cosine).
#[derive(Debug, Clone)]
pub(crate) struct DenseColumns {
    /// Per column id: its place in the dense block, or -1.
    pub(crate) slot: Vec<i32>,
    /// How many, and the block's width (padded to [`DENSE_TILE_K`]).
    pub(crate) count: usize,
    pub(crate) kp: usize,
    /// [`dense_flags`] of their values, ORed.
    pub(crate) flags: u32,
}

/// Cost of one multiply-add of the dense product per TF32 pass, in units of one inverted-list
/// entry walked by the folded kernels. A column of share ρ of the rows costs about ρ² entries
/// per pair of rows in the lists and this per pass as a dense column. Fitted on an H200 (full
/// self-joins, bench/gpu_runs/dense): an entry walked ~8e-12 s, a pair finished ~1e-11 s, a
/// half-precision multiply-add 2e-14 s (half a TF32 pass).
const DENSE_MAC_COST: f64 = 4e-3;
/// Cost per pair of rows of the product's output (written, then read by the folded kernels) and
/// of the smaller launches it makes, in the same unit: the dense columns must save more than
/// this together. Fitted so that the movielens shape's 76 columns of share >= 5% (76% of the
/// entries walked, a 0.3 s loss measured) are not taken.
const DENSE_PAIR_COST: f64 = 1.5;

/// Chooses the dense columns of `right` for `choice`, within `max_bytes` of dense block; None
/// when none is worth it (or allowed).
pub(crate) fn choose_dense_columns(
    right: &SparseBatch,
    columns: &ColumnMap,
    choice: crate::options::DenseColumnChoice,
    max_bytes: u64,
) -> Option<DenseColumns> {
    use crate::options::DenseColumnChoice;
    let rows = right.len();
    if choice == DenseColumnChoice::Off || rows == 0 {
        return None;
    }
    let ncols = columns.len();
    // One pass counts each column's nonzeros and ORs every value's flags; the columns holding
    // a value outside the product's range are listed (rare). A count per column and nothing
    // else per entry: this choice is made for every dot or cosine build (~0.1 s at the
    // movielens shape when it also kept two flag arrays per chunk and merged them on one core).
    let threads = rayon::current_num_threads().max(1);
    let nchunks = (threads * 2)
        .min((256 << 20) / (ncols.max(1) * 4))
        .min(right.nnz() / (1 << 16) + 1)
        .clamp(1, rows);
    // Over the flat entries (rows only delimit them), so that each loop is a plain one.
    let offsets = right.offsets();
    let (first, last) = (offsets[0] as usize, offsets[rows] as usize);
    let (all_idx, all_val) = (&right.indices()[first..last], &right.values()[first..last]);
    let entries = last - first;
    let chunk = |ch: usize| {
        let range = entries * ch / nchunks..entries * (ch + 1) / nchunks;
        (&all_idx[range.clone()], &all_val[range])
    };
    let per_chunk: Vec<(Vec<u32>, Vec<u32>, u32)> = (0..nchunks)
        .into_par_iter()
        .map(|ch| {
            let (idx, val) = chunk(ch);
            let mut counts = vec![0u32; ncols];
            for (&c, &v) in idx.iter().zip(val) {
                let id = columns.get(c).expect("a column of the right side");
                counts[id as usize] += u32::from(v != 0.0);
            }
            let flags = val
                .iter()
                .fold(0u32, |f, &v| f | if v != 0.0 { dense_flags(v) } else { 0 });
            let bad = if val.iter().all(|&v| dense_value_ok(v)) {
                Vec::new()
            } else {
                idx.iter()
                    .zip(val)
                    .filter(|(_, &v)| !dense_value_ok(v))
                    .map(|(&c, _)| columns.get(c).expect("a column of the right side"))
                    .collect()
            };
            (counts, bad, flags)
        })
        .collect();
    // Summed over blocks of columns on every core.
    let mut counts = vec![0u64; ncols];
    counts
        .par_chunks_mut(1 << 14)
        .enumerate()
        .for_each(|(block, sums)| {
            let start = block << 14;
            let len = sums.len();
            for (c, _, _) in &per_chunk {
                for (sum, &n) in sums.iter_mut().zip(&c[start..start + len]) {
                    *sum += n as u64;
                }
            }
        });
    let mut bad = vec![false; ncols];
    for (_, b, _) in &per_chunk {
        for &id in b {
            bad[id as usize] = true;
        }
    }
    let any_bad = bad.iter().any(|&b| b);
    let all_flags = per_chunk.iter().fold(0, |f, (_, _, g)| f | g);
    drop(per_chunk);
    // The flags of the columns in `keep`, from a second pass over their entries only.
    let flags_of = |keep: &[bool]| -> u32 {
        (0..nchunks)
            .into_par_iter()
            .map(|ch| {
                let (idx, val) = chunk(ch);
                idx.iter().zip(val).fold(0u32, |flags, (&c, &v)| {
                    let id = columns.get(c).expect("a column of the right side") as usize;
                    if v != 0.0 && keep[id] {
                        flags | dense_flags(v)
                    } else {
                        flags
                    }
                })
            })
            .reduce(|| 0, |a, b| a | b)
    };
    let mut order: Vec<usize> = (0..ncols).filter(|&c| !bad[c] && counts[c] > 0).collect();
    order.par_sort_unstable_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
    let share = |c: usize| counts[c] as f64 / rows as f64;
    let mut chosen: Vec<usize> = match choice {
        DenseColumnChoice::Off => unreachable!("handled above"),
        DenseColumnChoice::MinShare(min) => {
            order.into_iter().take_while(|&c| share(c) >= min).collect()
        }
        DenseColumnChoice::Auto => {
            // The left side is taken to look like the right (a self-join's does): small counts
            // go through the 8-bit product (four times TF32's rate), counts through the half-
            // precision one (twice), TF32 numbers through one TF32 product, other values
            // through the split one (three).
            // The flags of every column that could be taken (all but those with a value
            // outside the range).
            let flags = if any_bad {
                let not_bad: Vec<bool> = bad.iter().map(|&b| !b).collect();
                flags_of(&not_bad)
            } else {
                all_flags
            };
            let passes = match fast_kind(flags, order.len()) {
                FastKind::Int8 => 0.25,
                FastKind::Half => 0.5,
                FastKind::None if flags & DENSE_NOT_TF32 != 0 => 3.0,
                FastKind::None => 1.0,
            };
            let taken: Vec<usize> = order
                .into_iter()
                .take_while(|&c| share(c) * share(c) > DENSE_MAC_COST * passes)
                .collect();
            let saved: f64 = taken
                .iter()
                .map(|&c| share(c) * share(c) - DENSE_MAC_COST * passes)
                .sum();
            if saved > DENSE_PAIR_COST {
                taken
            } else {
                Vec::new()
            }
        }
    };
    // Within the memory given (the densest kept).
    let n_pad = rows.div_ceil(DENSE_TILE_N) * DENSE_TILE_N;
    let max_cols = (max_bytes / (n_pad as u64 * 6)) as usize / DENSE_TILE_K * DENSE_TILE_K;
    chosen.truncate(max_cols);
    if chosen.is_empty() {
        return None;
    }
    let mut slot = vec![-1i32; ncols];
    let mut taken = vec![false; ncols];
    for (i, &c) in chosen.iter().enumerate() {
        slot[c] = i as i32;
        taken[c] = true;
    }
    Some(DenseColumns {
        count: chosen.len(),
        kp: chosen.len().div_ceil(DENSE_TILE_K) * DENSE_TILE_K,
        flags: flags_of(&taken),
        slot,
    })
}

/// A rough size of rows `start..end` prepared for the device (to decide on parts).
pub(crate) fn estimate_bytes(
    right: &SparseBatch,
    start: usize,
    end: usize,
    program: &MetricProgram,
    columns: &ColumnMap,
    tile_rows: usize,
    dense: Option<&DenseColumns>,
) -> u64 {
    let rows = (end - start) as u64;
    // The block and (counts) its half-precision copy.
    let dense_bytes = dense.map_or(0, |d| {
        (rows.div_ceil(DENSE_TILE_N as u64) * DENSE_TILE_N as u64) * d.kp as u64 * 6
            + columns.len() as u64 * 4
    });
    let nnz = (right.offsets()[end] - right.offsets()[start]) as u64;
    let ntiles = (end - start).div_ceil(tile_rows.max(1)) as u64;
    let max_extra = if program.max_reduction {
        nnz + rows * TOP_VALUES as u64 * 4
    } else {
        0
    };
    nnz * 8
        + max_extra
        + dense_bytes
        + rows * 2 * program.acc_bytes() as u64
        + columns.len() as u64 * 4 * (ntiles + 1)
        + rows / 8
        + 64
}

/// A bit per row of `start..end`, set for a valid (non-null) row; empty when every row is valid
/// (the kernels then read no bits).
fn valid_bits(right: &SparseBatch, start: usize, end: usize) -> Vec<u32> {
    if (start..end).all(|r| !right.is_null(r)) {
        return Vec::new();
    }
    let mut bits = vec![0u32; (end - start).div_ceil(32)];
    for r in start..end {
        if !right.is_null(r) {
            bits[(r - start) / 32] |= 1 << ((r - start) % 32);
        }
    }
    bits
}

/// How a part is laid out for the kernels: the metric's program, the column ids, the tile
/// height and the dense columns.
pub(crate) struct PartShape<'a> {
    pub(crate) program: &'a MetricProgram,
    pub(crate) columns: &'a ColumnMap,
    pub(crate) tile_rows: usize,
    pub(crate) dense: Option<&'a DenseColumns>,
    /// Leave the inverted lists for the device ([`HostPart::device_lists`]).
    pub(crate) lists_on_device: bool,
}

/// Rows `start..end` of the right side, as the kernels of `shape.program` read them; `totals`
/// are the definition's totals of every right row.
pub(crate) fn prepare_part(
    right: &SparseBatch,
    totals: &[RowTotals],
    start: usize,
    end: usize,
    shape: &PartShape<'_>,
) -> HostPart {
    let (program, columns, tile_rows, dense) =
        (shape.program, shape.columns, shape.tile_rows, shape.dense);
    let rows = end - start;
    let mut part = HostPart {
        first_row: start,
        rows,
        valid_bits: valid_bits(right, start, end),
        ..Default::default()
    };
    if let Some(dense) = dense {
        // The dense columns stay in the inverted lists too: a left chunk with values outside
        // the product's range runs without it, and the block is filled from them.
        part.dense_slot = dense.slot.clone();
        part.dense_kp = dense.kp;
        part.dense_n_pad = rows.div_ceil(DENSE_TILE_N) * DENSE_TILE_N;
        part.dense_flags = dense.flags;
    }
    part.rt0 = totals[start..end].iter().map(|t| t.t0).collect();
    part.rt1 = totals[start..end].iter().map(|t| t.t1).collect();
    if program.key_form == KeyForm::Quotient {
        part.key_base = totals[start..end]
            .iter()
            .map(|t| program.key_form.base(t))
            .collect();
    }
    let (o0, o1) = (
        right.offsets()[start] as usize,
        right.offsets()[end] as usize,
    );
    // In float32 over blocks (the extremes of floats are floats): a filter and a map per value
    // in float64 took 120 ms of the movielens shape's 320 ms on 2 cores.
    // (and the nonzeros counted, which size lists built on the device)
    let (y_min, y_max, nonzeros) = right.values()[o0..o1]
        .par_chunks(1 << 16)
        .map(|block| {
            let (lo, hi) = block.iter().fold((f32::INFINITY, 0f32), |(lo, hi), v| {
                let a = v.abs();
                // (a select, not a branch: the loop vectorises)
                (lo.min(if a != 0.0 { a } else { f32::INFINITY }), hi.max(a))
            });
            let nonzeros = block.iter().map(|&v| usize::from(v != 0.0)).sum::<usize>();
            (lo, hi, nonzeros)
        })
        .reduce(
            || (f32::INFINITY, 0.0, 0),
            |a, b| (a.0.min(b.0), a.1.max(b.1), a.2 + b.2),
        );
    part.y_min = if y_min.is_finite() { y_min as f64 } else { 0.0 };
    part.y_max = y_max as f64;
    let ncols = columns.len();
    // A max: every entry's rank in its row (CSR order), placed beside the entries by either
    // build, and each row's largest values.
    let max = program.max_reduction;
    let entry_ranks = if max {
        let (ranks, top) = row_ranks(right, start, end);
        part.r_top = top;
        ranks
    } else {
        Vec::new()
    };
    if shape.lists_on_device {
        // A null row's stored entries (a struct's null slot may keep its lists' ranges) stay
        // out of the lists, as in the build below: the device skips the row.
        let null_rows_nonzeros = if part.valid_bits.is_empty() {
            0
        } else {
            (start..end)
                .filter(|&r| right.is_null(r))
                .map(|r| {
                    let (a, b) = (right.offsets()[r] as usize, right.offsets()[r + 1] as usize);
                    right.values()[a..b].iter().filter(|&&v| v != 0.0).count()
                })
                .sum()
        };
        part.entry_ranks = entry_ranks;
        part.ntiles = rows.div_ceil(tile_rows).max(1);
        part.device_lists = Some(DeviceLists {
            entries: nonzeros - null_rows_nonzeros,
            ncols,
        });
        return part;
    }
    // CSC over the part's rows, row-sorted within each column, built in parallel: each chunk of
    // rows counts its entries per column, the counts give every (column, chunk) its own output
    // range in row order, and the chunks fill their ranges at once.
    // One chunk a core, cut at equal entries (rows of power-law degrees cut at equal rows needed
    // two chunks a core to keep the cores even): each chunk holds a count and a first slot per
    // column, as much work for a GPU's shard as for the whole right side (194K columns at the
    // movielens shape), so fewer chunks keep that fixed part small.
    let nchunks = rayon::current_num_threads()
        .min((256 << 20) / (ncols.max(1) * 4))
        .clamp(1, rows.max(1));
    let offsets = &right.offsets()[start..=end];
    let bounds: Vec<usize> = (0..=nchunks)
        .map(|i| match i {
            // (the last bound takes the empty rows at the end too)
            i if i == nchunks => end,
            i => start + offsets.partition_point(|&o| (o as usize) < o0 + (o1 - o0) * i / nchunks),
        })
        .collect();
    let chunk_counts: Vec<Vec<u32>> = (0..nchunks)
        .into_par_iter()
        .map(|ch| {
            let mut counts = vec![0u32; ncols];
            for r in bounds[ch]..bounds[ch + 1] {
                let (idx, val) = right.row(r);
                for (&c, &v) in idx.iter().zip(val) {
                    if v != 0.0 {
                        counts[columns.get(c).expect("a column of the right side") as usize] += 1;
                    }
                }
            }
            counts
        })
        .collect();
    // Column starts, then each (chunk, column)'s first slot, in parallel over blocks of
    // columns: a loop over every column and chunk on one thread was a third of the build
    // (194K columns x 64 chunks at the movielens shape), and as long for a GPU's half of the
    // rows as for all of them.
    const COLUMN_BLOCK: usize = 4096;
    let col_totals: Vec<u32> = (0..ncols)
        .into_par_iter()
        .with_min_len(COLUMN_BLOCK)
        .map(|c| chunk_counts.iter().map(|counts| counts[c]).sum())
        .collect();
    let mut col_start = Vec::with_capacity(ncols + 1);
    let mut running = 0u32;
    for &total in &col_totals {
        col_start.push(running);
        running += total;
    }
    col_start.push(running);
    let nnz = running as usize;
    let mut chunk_offsets = vec![vec![0u32; ncols]; nchunks];
    {
        // Per block of columns, every chunk's slice of those columns.
        let mut blocks: Vec<Vec<&mut [u32]>> = (0..ncols.div_ceil(COLUMN_BLOCK))
            .map(|_| Vec::with_capacity(nchunks))
            .collect();
        for offsets in chunk_offsets.iter_mut() {
            for (b, slice) in offsets.chunks_mut(COLUMN_BLOCK).enumerate() {
                blocks[b].push(slice);
            }
        }
        blocks
            .into_par_iter()
            .enumerate()
            .for_each(|(b, mut per_chunk)| {
                let c0 = b * COLUMN_BLOCK;
                let mut next: Vec<u32> = col_start[c0..(c0 + COLUMN_BLOCK).min(ncols)].to_vec();
                for (ch, offsets) in per_chunk.iter_mut().enumerate() {
                    let counts = &chunk_counts[ch][c0..c0 + offsets.len()];
                    for ((slot, n), &count) in offsets.iter_mut().zip(next.iter_mut()).zip(counts) {
                        *slot = *n;
                        *n += count;
                    }
                }
            });
    }
    part.col_entries = vec![0; nnz];
    advise_huge_pages(&part.col_entries);
    if max {
        part.col_ranks = vec![0; nnz];
    }
    {
        let entries_out = SharedOut(part.col_entries.as_mut_ptr());
        let ranks_out = SharedOut(part.col_ranks.as_mut_ptr());
        chunk_offsets
            .into_par_iter()
            .enumerate()
            .for_each(|(ch, mut fill)| {
                let (entries_out, ranks_out) = (&entries_out, &ranks_out);
                for r in bounds[ch]..bounds[ch + 1] {
                    let (idx, val) = right.row(r);
                    let ranks = if max {
                        let at = right.offsets()[r] as usize - o0;
                        &entry_ranks[at..at + val.len()]
                    } else {
                        &[][..]
                    };
                    for (e, (&c, &v)) in idx.iter().zip(val).enumerate() {
                        if v != 0.0 {
                            let slot = &mut fill[columns.get(c).unwrap() as usize];
                            // SAFETY: (column, chunk) ranges are disjoint and inside the buffers
                            // (their lengths are the counts of this very pass).
                            unsafe {
                                *entries_out.0.add(*slot as usize) =
                                    list_entry((r - start) as u32, v);
                                if max {
                                    *ranks_out.0.add(*slot as usize) = ranks[e];
                                }
                            }
                            *slot += 1;
                        }
                    }
                }
            });
    }
    let counts = col_start;
    // Where each column crosses each tile boundary.
    let ntiles = rows.div_ceil(tile_rows).max(1);
    part.ntiles = ntiles;
    part.tile_ptr = vec![0u32; ncols * (ntiles + 1)];
    advise_huge_pages(&part.tile_ptr);
    part.tile_ptr
        .par_chunks_mut(ntiles + 1)
        .enumerate()
        .for_each(|(c, tp)| {
            let (s, e) = (counts[c] as usize, counts[c + 1] as usize);
            // One pass over the column's rows (sorted) beside the tile bounds.
            let col = &part.col_entries[s..e];
            let mut i = 0;
            for (t, slot) in tp[..ntiles].iter_mut().enumerate() {
                let bound = (t * tile_rows) as u32;
                while i < col.len() && (col[i] as u32) < bound {
                    i += 1;
                }
                *slot = (s + i) as u32;
            }
            tp[ntiles] = e as u32;
        });
    part
}

/// Asks the kernel to back `buffer`'s untouched pages with 2 MiB pages (Linux, transparent huge
/// pages in `madvise` mode, the common default): the inverted lists and the tile pointers are
/// fresh zeroed memory written once at random, and faulting them in 4 KiB at a time bounded the
/// build (1-2 GB/s on 2 cores). Elsewhere, or where the kernel declines, nothing changes.
fn advise_huge_pages<T>(buffer: &[T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let at = buffer.as_ptr() as usize;
        let (start, end) = (
            at.next_multiple_of(HUGE),
            (at + std::mem::size_of_val(buffer)) / HUGE * HUGE,
        );
        if end > start {
            // SAFETY: the range lies inside `buffer`'s allocation; the advice changes how its
            // pages are backed, never their contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
}

/// An inverted-list entry as the kernels read it (a `uint2`): the row, then the value's bits.
pub(crate) fn list_entry(row: u32, value: f32) -> u64 {
    row as u64 | (value.to_bits() as u64) << 32
}

/// Largest |values| kept per row for a max (chebyshev): the kernels know which of a row's 32
/// largest entries a pair shares; the 33rd bounds the rest (`max_pair` in kernels/knn.cu).
pub(crate) const TOP_VALUES: usize = 33;

/// A row's entries ranked by |value|, descending (ties by position; zeros are not ranked): `ranks`
/// gets each entry's rank (255 from 255 on, and for zeros), `top` the TOP_VALUES largest |values|
/// in rank order, zero past the row's nonzeros.
pub(crate) fn max_ranks(values: &[f32], ranks: &mut Vec<u8>, top: &mut [f32; TOP_VALUES]) {
    let mut order: Vec<usize> = (0..values.len()).filter(|&e| values[e] != 0.0).collect();
    order.sort_by(|&a, &b| values[b].abs().total_cmp(&values[a].abs()).then(a.cmp(&b)));
    ranks.clear();
    ranks.resize(values.len(), 255);
    *top = [0.0; TOP_VALUES];
    for (rank, &e) in order.iter().enumerate() {
        ranks[e] = rank.min(255) as u8;
        if rank < TOP_VALUES {
            top[rank] = values[e].abs();
        }
    }
}

/// [`max_ranks`] of rows `start..end`: every entry's rank in the rows' CSR order, and each row's
/// TOP_VALUES largest |values|.
fn row_ranks(right: &SparseBatch, start: usize, end: usize) -> (Vec<u8>, Vec<f32>) {
    let base = right.offsets()[start] as usize;
    let mut ranks = vec![0u8; right.offsets()[end] as usize - base];
    let mut top = vec![0f32; (end - start) * TOP_VALUES];
    let (ranks_out, top_out) = (SharedOut(ranks.as_mut_ptr()), SharedOut(top.as_mut_ptr()));
    (start..end).into_par_iter().for_each_init(
        || (Vec::new(), [0f32; TOP_VALUES]),
        |(row_ranks, row_top), r| {
            let (ranks_out, top_out) = (&ranks_out, &top_out);
            let values = right.row(r).1;
            max_ranks(values, row_ranks, row_top);
            let at = right.offsets()[r] as usize - base;
            // SAFETY: row r's entries and TOP_VALUES slots are this task's alone, inside the
            // buffers (sized by the rows' offsets and count).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    row_ranks.as_ptr(),
                    ranks_out.0.add(at),
                    values.len(),
                );
                std::ptr::copy_nonoverlapping(
                    row_top.as_ptr(),
                    top_out.0.add((r - start) * TOP_VALUES),
                    TOP_VALUES,
                );
            }
        },
    );
    (ranks, top)
}

/// A buffer that parallel tasks write at disjoint positions.
struct SharedOut<T>(*mut T);
// SAFETY: only used for writes to disjoint positions (see prepare_part).
unsafe impl<T> Sync for SharedOut<T> {}

/// `host` on the device; a part that left its inverted lists for the device
/// ([`HostPart::device_lists`]) builds them there from `source`.
pub(crate) fn upload_part(
    device: &Device,
    program: &MetricProgram,
    host: &HostPart,
    source: Option<&ListSource<'_>>,
    stats: &mut GpuStats,
) -> Result<DevPart> {
    let mut part = upload_lists(device, host, stats)?;
    if host.device_lists.is_some() {
        let source = source.expect("the rows of a part whose lists are built on the device");
        let started = std::time::Instant::now();
        let built = super::lists::build(device, program, host, &part, source, stats)?;
        (part.tile_ptr, part.col_entries) = (built.tile_ptr, built.col_entries);
        if let Some(ranks) = built.col_ranks {
            part.col_ranks = ranks;
        }
        log::debug!(
            "GPU {}: inverted lists built on the device in {:?}",
            device.ordinal,
            started.elapsed()
        );
    }
    if host.dense_kp > 0 {
        part.dense = Some(fill_dense(device, program, host, &part, stats)?);
    }
    Ok(part)
}

/// The part's dense block, made on the device from its inverted lists (`dense_fill`).
fn fill_dense(
    device: &Device,
    program: &MetricProgram,
    host: &HostPart,
    part: &DevPart,
    stats: &mut GpuStats,
) -> Result<DevDense> {
    let n = host.dense_n_pad * host.dense_kp;
    let block = zeros::<f32>(device, n)?;
    let kind = fast_kind(host.dense_flags, host.dense_kp);
    let fast = match kind {
        FastKind::None => None,
        _ => Some(zeros::<u8>(device, n * kind.bytes())?),
    };
    let slot = upload(device, &host.dense_slot, stats)?;
    let args = DenseFillArgs {
        tile_ptr: addr(device, &part.tile_ptr),
        col_entries: addr(device, &part.col_entries),
        ntiles: host.ntiles as i32,
        ncols: host.dense_slot.len() as i32,
        dense_slot: addr(device, &slot),
        b: addr(device, &block),
        b_fast: fast.as_ref().map_or(0, |b| addr(device, b)),
        kp: host.dense_kp as i32,
        fast_kind: kind as i32,
    };
    let f = device.function(program, "dense_fill", 0)?;
    let cfg = LaunchConfig {
        grid_dim: (
            host.dense_slot.len().div_ceil(8).clamp(1, 65_535) as u32,
            1,
            1,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = device.stream.launch_builder(&f);
    b.arg(&args);
    // SAFETY: `DenseFillArgs` is the kernel's one parameter (its CUDA twin generated from it);
    // every list row is below the part's rows <= n_pad and every slot below kp; the buffers
    // outlive the launch (the stream is synchronised before the part is used).
    unsafe { b.launch(cfg) }.map_err(cuda_err("launching the kernel"))?;
    Ok(DevDense {
        block,
        fast,
        fast_kind: kind,
        slot,
        kp: host.dense_kp,
        n_pad: host.dense_n_pad,
        flags: host.dense_flags,
    })
}

fn upload_lists(device: &Device, host: &HostPart, stats: &mut GpuStats) -> Result<DevPart> {
    Ok(DevPart {
        valid_bits: upload(device, &host.valid_bits, stats)?,
        all_valid: host.valid_bits.is_empty(),
        rt0: upload(device, &host.rt0, stats)?,
        rt1: upload(device, &host.rt1, stats)?,
        key_base: upload(device, &host.key_base, stats)?,
        tile_ptr: upload(device, &host.tile_ptr, stats)?,
        col_entries: upload(device, &host.col_entries, stats)?,
        col_ranks: upload(device, &host.col_ranks, stats)?,
        r_top: upload(device, &host.r_top, stats)?,
        y_min: host.y_min,
        y_max: host.y_max,
        bytes: host.device_bytes(),
        dense: None,
    })
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::metric::{Metric, MetricKind, Semiring};

    /// Rows `start..end` of `right` prepared for `metric` over direct column ids below `ncols`.
    fn part_of(
        right: &SparseBatch,
        metric: &Metric,
        ncols: usize,
        (start, end): (usize, usize),
        tile_rows: usize,
        lists_on_device: bool,
    ) -> HostPart {
        crate::with_semiring!(metric, s => {
            let totals: Vec<RowTotals> = (0..right.len())
                .map(|r| s.totals(right.row(r).1.iter().copied().filter(|x| *x != 0.0)))
                .collect();
            let program = MetricProgram::of(&s);
            let shape = PartShape {
                program: &program,
                columns: &ColumnMap::Direct(ncols),
                tile_rows,
                dense: None,
                lists_on_device,
            };
            prepare_part(right, &totals, start, end, &shape)
        })
    }

    /// A part that leaves its lists for the device: the host's half (what sizes the device's
    /// lists, a max's ranks in CSR order, the tiles, everything else) agrees with the host's own
    /// build of the same rows, null rows keeping entries in their ranges included (the device
    /// skips those rows, as the host's build does).
    #[test]
    fn a_part_left_for_the_device_agrees_with_the_hosts_build() {
        use arrow::buffer::NullBuffer;
        let mut rng = StdRng::seed_from_u64(7);
        let (mut offsets, mut indices, mut values, mut valid) =
            (vec![0i32], vec![], vec![], vec![]);
        for r in 0..700 {
            let deg = if r % 50 == 0 {
                60
            } else {
                rng.random_range(0..12)
            };
            for c in 0..deg {
                indices.push(c * 7 + r % 7);
                // stored zeros and ties among the largest values
                values.push(rng.random_range(0..6) as f32 * if r % 2 == 0 { 1.0 } else { -0.5 });
            }
            offsets.push(indices.len() as i32);
            valid.push(r % 9 != 4);
        }
        let right = SparseBatch::from_parts(
            offsets.into(),
            indices.into(),
            values.into(),
            Some(NullBuffer::from(valid)),
        );
        let ncols = right.max_dim();
        for kind in [MetricKind::Cosine, MetricKind::Chebyshev] {
            let metric = Metric::from_kind(kind, None, None).unwrap();
            for (start, end) in [(0, 700), (130, 521)] {
                let [host, left] = [false, true]
                    .map(|on_device| part_of(&right, &metric, ncols, (start, end), 64, on_device));
                let at = format!("{kind} rows {start}..{end}");
                assert!(
                    host.device_lists.is_none() && left.tile_ptr.is_empty(),
                    "{at}"
                );
                let lists = left.device_lists.expect("lists left for the device");
                assert_eq!(lists.entries, host.col_entries.len(), "{at}: entries");
                assert_eq!(lists.ncols, ncols, "{at}");
                assert_eq!(left.ntiles, host.ntiles, "{at}");
                assert_eq!(
                    left.device_bytes(),
                    host.device_bytes(),
                    "{at}: device bytes"
                );
                assert_eq!((left.y_min, left.y_max), (host.y_min, host.y_max), "{at}");
                assert_eq!(
                    (&left.rt0, &left.valid_bits),
                    (&host.rt0, &host.valid_bits),
                    "{at}"
                );
                assert_eq!(left.r_top, host.r_top, "{at}: largest values");
                if kind == MetricKind::Chebyshev {
                    // Each listed entry's rank, read at its CSR position, is the one the host
                    // placed beside it (entries of valid rows, in the host's column order).
                    let base = right.offsets()[start] as usize;
                    let mut by_column: Vec<Vec<(u32, u8)>> = vec![Vec::new(); ncols];
                    for r in start..end {
                        let (idx, val) = right.row(r);
                        let at_row = right.offsets()[r] as usize - base;
                        for (e, (&c, &v)) in idx.iter().zip(val).enumerate() {
                            if v != 0.0 {
                                let rank = left.entry_ranks[at_row + e];
                                by_column[c as usize].push(((r - start) as u32, rank));
                            }
                        }
                    }
                    let listed: Vec<(u32, u8)> = by_column.concat();
                    let hosts: Vec<(u32, u8)> = host
                        .col_entries
                        .iter()
                        .zip(&host.col_ranks)
                        .map(|(&entry, &rank)| (entry as u32, rank))
                        .collect();
                    assert_eq!(listed, hosts, "{at}: ranks");
                } else {
                    assert!(left.entry_ranks.is_empty(), "{at}");
                }
            }
        }
    }

    /// The parallel CSC (counts, column starts per chunk cut at equal entries, fill) against the
    /// plain one: every column's entries in row order, and each tile's split point; for the whole
    /// batch and for parts of it (a range starting inside, one ending in a run of empty rows, one
    /// of empty rows only), on one core and on several.
    #[test]
    fn the_inverted_index_equals_a_plain_transpose() {
        let ncols = 10_000usize; // more than one block of columns
        let mut rng = StdRng::seed_from_u64(12345);
        let mut rows: Vec<Vec<(i32, f32)>> = (0..3_000)
            .map(|r| {
                // Power-law degrees, so that equal rows and equal entries cut differently.
                let deg = if r % 97 == 0 {
                    900
                } else {
                    rng.random_range(0..40)
                };
                let mut cols: Vec<i32> = (0..deg)
                    .map(|_| rng.random_range(0..ncols as i32))
                    .collect();
                // A popular column, in many rows of every tile.
                if r % 3 == 0 {
                    cols.push(7);
                }
                cols.sort_unstable();
                cols.dedup();
                // Some stored zeros, which the index leaves out.
                cols.into_iter()
                    .map(|c| (c, rng.random_range(0..5) as f32))
                    .collect()
            })
            .collect();
        rows.extend(std::iter::repeat_n(Vec::new(), 50));
        let right = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
        let metric = Metric::from_kind(MetricKind::Cosine, None, None).unwrap();
        let tile_rows = 256;
        let n = rows.len();
        for (start, end) in [(0, n), (1_234, 2_900), (2_500, n), (3_010, n)] {
            for threads in [1, 3, 8] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let part = pool
                    .install(|| part_of(&right, &metric, ncols, (start, end), tile_rows, false));
                let mut columns: Vec<Vec<(u32, f32)>> = vec![Vec::new(); ncols];
                for (r, row) in rows[start..end].iter().enumerate() {
                    for &(c, v) in row {
                        if v != 0.0 {
                            columns[c as usize].push((r as u32, v));
                        }
                    }
                }
                let ntiles = part.ntiles;
                let at = format!("rows {start}..{end} on {threads} threads");
                let magnitudes = || {
                    rows[start..end]
                        .iter()
                        .flatten()
                        .map(|&(_, v)| v.abs() as f64)
                        .filter(|&a| a != 0.0)
                };
                let y_min = magnitudes().fold(f64::INFINITY, f64::min);
                let y_max = magnitudes().fold(0.0, f64::max);
                assert_eq!(
                    (part.y_min, part.y_max),
                    (if y_min.is_finite() { y_min } else { 0.0 }, y_max),
                    "{at}"
                );
                assert_eq!(ntiles, (end - start).div_ceil(tile_rows).max(1), "{at}");
                for (c, want) in columns.iter().enumerate() {
                    let tp = &part.tile_ptr[c * (ntiles + 1)..(c + 1) * (ntiles + 1)];
                    let (s, e) = (tp[0] as usize, tp[ntiles] as usize);
                    let got: Vec<(u32, f32)> = (s..e)
                        .map(|i| {
                            let entry = part.col_entries[i];
                            (entry as u32, f32::from_bits((entry >> 32) as u32))
                        })
                        .collect();
                    assert_eq!(&got, want, "column {c}, {at}");
                    for t in 0..ntiles {
                        let inside = &part.col_entries[tp[t] as usize..tp[t + 1] as usize];
                        assert!(
                            inside.iter().all(|&e| (e as u32) as usize / tile_rows == t),
                            "column {c}, tile {t}, {at}"
                        );
                    }
                }
            }
        }
    }

    /// Rows whose column c (of 0..8) is nonzero in about (8 - c) / 8 of them, plus sparse
    /// columns 100.. each in a few rows; values are counts, or fractions where `fractions`.
    fn shares_batch(rows: usize, fractions: bool) -> SparseBatch {
        let mut rng = StdRng::seed_from_u64(7);
        let rows: Vec<Vec<(i32, f32)>> = (0..rows)
            .map(|r| {
                let mut row: Vec<(i32, f32)> = (0..8)
                    .filter(|c| (r % 8) < 8 - *c as usize)
                    .map(|c| {
                        let v = rng.random_range(1..100) as f32;
                        (c, if fractions { v / 7.0 } else { v })
                    })
                    .collect();
                row.push((100 + (r % 5000) as i32, 1.0));
                row
            })
            .collect();
        SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())))
    }

    #[test]
    fn dense_columns_are_the_densest_within_the_choice_and_memory() {
        use crate::options::DenseColumnChoice;
        let right = shares_batch(4000, false);
        let columns = ColumnMap::Direct(right.max_dim());
        let unlimited = u64::MAX;
        assert!(
            choose_dense_columns(&right, &columns, DenseColumnChoice::Off, unlimited).is_none()
        );
        // Shares 1, 7/8, ..., 1/8: at least 0.3 takes columns 0..=5 (6/8 = 0.75 .. 3/8).
        let d = choose_dense_columns(
            &right,
            &columns,
            DenseColumnChoice::MinShare(0.3),
            unlimited,
        )
        .unwrap();
        assert_eq!(d.count, 6);
        assert_eq!(d.kp, DENSE_TILE_K);
        assert_eq!(
            d.flags, 0,
            "counts below 100 are TF32 numbers, half- and 8-bit-exact"
        );
        for c in 0..columns.len() {
            assert_eq!(d.slot[c] >= 0, c < 6, "column {c}");
        }
        // The slots are in order of share (densest first).
        assert_eq!(&d.slot[..6], &[0, 1, 2, 3, 4, 5]);
        // Auto: counts need one TF32 pass; every column with share² above its cost is taken.
        let auto =
            choose_dense_columns(&right, &columns, DenseColumnChoice::Auto, unlimited).unwrap();
        assert_eq!(auto.count, 8);
        // Fractions need the split product (three passes): the same columns still pay here.
        let split = shares_batch(4000, true);
        let auto =
            choose_dense_columns(&split, &columns, DenseColumnChoice::Auto, unlimited).unwrap();
        assert_eq!(auto.count, 8);
        assert_eq!(auto.flags, DENSE_NOT_TF32 | DENSE_NOT_HALF | DENSE_NOT_INT8);
        // Uniformly sparse columns are not worth a product.
        let sparse_rows: Vec<Vec<(i32, f32)>> = (0..4000).map(|r| vec![(r % 3000, 2.0)]).collect();
        let sparse = SparseBatch::from_rows(sparse_rows.iter().map(|r| Some(r.as_slice())));
        let sparse_cols = ColumnMap::Direct(sparse.max_dim());
        assert!(
            choose_dense_columns(&sparse, &sparse_cols, DenseColumnChoice::Auto, unlimited)
                .is_none()
        );
        // Memory is counted in whole tiles of columns (64 of 4,096 padded rows, 6 bytes each).
        let tile = 4096 * 6 * DENSE_TILE_K as u64;
        let d =
            choose_dense_columns(&right, &columns, DenseColumnChoice::MinShare(0.1), tile).unwrap();
        assert_eq!(d.count, 8);
        assert!(
            choose_dense_columns(&right, &columns, DenseColumnChoice::MinShare(0.1), tile - 1)
                .is_none()
        );
        // A column with a value outside the product's range stays sparse.
        let mut rows: Vec<Vec<(i32, f32)>> = (0..100).map(|_| vec![(0, 1.0), (1, 2.0)]).collect();
        rows[50][1].1 = 3.0e12;
        let odd = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
        let d = choose_dense_columns(
            &odd,
            &ColumnMap::Direct(2),
            DenseColumnChoice::MinShare(0.5),
            unlimited,
        )
        .unwrap();
        assert_eq!((d.count, d.slot[0], d.slot[1]), (1, 0, -1));
        // The flags are those of the chosen columns only.
        let rows: Vec<Vec<(i32, f32)>> = (0..100)
            .map(|r| {
                let mut row = vec![(0, 3.0)];
                if r % 3 == 0 {
                    row.push((1, 0.1 + r as f32));
                }
                row
            })
            .collect();
        let mixed = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
        let columns2 = ColumnMap::Direct(2);
        let only_counts = choose_dense_columns(
            &mixed,
            &columns2,
            DenseColumnChoice::MinShare(0.5),
            unlimited,
        )
        .unwrap();
        assert_eq!((only_counts.count, only_counts.flags), (1, 0));
        let both = choose_dense_columns(
            &mixed,
            &columns2,
            DenseColumnChoice::MinShare(0.2),
            unlimited,
        )
        .unwrap();
        assert_eq!(
            (both.count, both.flags),
            (2, DENSE_NOT_HALF | DENSE_NOT_TF32 | DENSE_NOT_INT8)
        );
    }

    #[test]
    fn flags_say_which_values_are_tf32_numbers_and_small_integers() {
        for v in [255.0f32, 1000.0, 2047.0, 2048.0, -2048.0] {
            assert_eq!(dense_flags(v), DENSE_NOT_INT8, "{v}");
        }
        for v in [1.0f32, 2.0, 127.0, -127.0] {
            assert_eq!(dense_flags(v), 0, "{v}");
        }
        for v in [128.0f32, 255.0, 2048.0, -2000.0] {
            assert_eq!(dense_flags(v), DENSE_NOT_INT8, "{v}");
        }
        let not_small = DENSE_NOT_HALF | DENSE_NOT_INT8;
        assert_eq!(dense_flags(0.5), not_small);
        assert_eq!(dense_flags(2049.0), not_small | DENSE_NOT_TF32);
        assert_eq!(dense_flags(4096.0), not_small);
        assert_eq!(dense_flags(0.1), not_small | DENSE_NOT_TF32);
        assert_eq!(fast_kind(0, 64), FastKind::Int8);
        assert_eq!(fast_kind(0, 200_000), FastKind::Half);
        assert_eq!(fast_kind(DENSE_NOT_INT8, 64), FastKind::Half);
        assert_eq!(fast_kind(not_small, 64), FastKind::None);
    }

    /// `dense_flags` without branches gives what its plain definition (a `round`) gives.
    #[test]
    fn dense_flags_equal_their_plain_definition() {
        let plain = |v: f32| -> u32 {
            let mut f = if v.to_bits() & 0x1fff != 0 {
                DENSE_NOT_TF32
            } else {
                0
            };
            let whole = v == v.round();
            if !(whole && v.abs() <= 2048.0) {
                f |= DENSE_NOT_HALF;
            }
            if !(whole && v.abs() <= 127.0) {
                f |= DENSE_NOT_INT8;
            }
            f
        };
        let mut rng = StdRng::seed_from_u64(3);
        let specials = [
            0.0,
            -0.0,
            0.5,
            1.0,
            -1.0,
            126.5,
            127.0,
            127.5,
            128.0,
            -127.0,
            -128.0,
            2047.5,
            2048.0,
            2048.5,
            2049.0,
            -2048.0,
            1e10,
            -1e10,
            1e-40,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            16777216.0,
            3e9,
        ];
        let values = specials
            .into_iter()
            .chain((-5000..5000).map(|i| i as f32 * 0.5))
            .chain((0..100_000).map(|_| f32::from_bits(rng.random::<u32>())))
            .collect::<Vec<f32>>()
            .into_iter()
            .chain((0..10_000).map(|_| rng.random_range(-3000.0f32..3000.0)));
        for v in values {
            assert_eq!(dense_flags(v), plain(v), "{v} ({:#x})", v.to_bits());
        }
    }

    /// The dense columns chosen, against a plain count: by share (`MinShare`), and by the cost
    /// model (`Auto`) on rows where three columns are in every row; a column holding a value
    /// outside the product's range is never taken, and the flags are those of the taken
    /// columns' values.
    #[test]
    fn dense_columns_follow_a_plain_count() {
        use crate::options::DenseColumnChoice;
        let mut rng = StdRng::seed_from_u64(9);
        let ncols = 300;
        let rows: Vec<Vec<(i32, f32)>> = (0..4_000)
            .map(|r| {
                let mut cols: Vec<i32> = vec![0, 1, 2, if r == 77 { 5 } else { 0 }];
                cols.extend((0..rng.random_range(0..12)).map(|_| {
                    // A few popular columns, then a long tail.
                    if rng.random_bool(0.5) {
                        rng.random_range(3..10)
                    } else {
                        rng.random_range(10..ncols as i32)
                    }
                }));
                cols.sort_unstable();
                cols.dedup();
                cols.into_iter()
                    .map(|c| {
                        let v = match c {
                            // Column 5 holds one value beyond the product's range.
                            5 if r == 77 => 1e20,
                            // Column 4 holds fractions, the rest counts and some stored zeros.
                            4 => 0.25 * rng.random_range(1..9) as f32,
                            _ => rng.random_range(0..6) as f32,
                        };
                        (c, v)
                    })
                    .collect()
            })
            .collect();
        let right = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
        let columns = ColumnMap::Direct(ncols);
        let mut counts = vec![0u64; ncols];
        for row in &rows {
            for &(c, v) in row {
                counts[c as usize] += u64::from(v != 0.0);
            }
        }
        let flags_of = |cols: &[usize]| {
            rows.iter()
                .flatten()
                .filter(|(c, v)| *v != 0.0 && cols.contains(&(*c as usize)))
                .fold(0, |f, &(_, v)| f | dense_flags(v))
        };
        let mut order: Vec<usize> = (0..ncols).filter(|&c| c != 5 && counts[c] > 0).collect();
        order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
        let share = |c: usize| counts[c] as f64 / rows.len() as f64;
        let by_share: Vec<usize> = order.iter().copied().filter(|&c| share(c) >= 0.2).collect();
        let d = choose_dense_columns(&right, &columns, DenseColumnChoice::MinShare(0.2), u64::MAX)
            .expect("columns of share 0.2 and more");
        assert_eq!(d.count, by_share.len());
        for (i, &c) in by_share.iter().enumerate() {
            assert_eq!(d.slot[c], i as i32, "column {c}");
        }
        assert_eq!(d.slot.iter().filter(|&&s| s >= 0).count(), by_share.len());
        assert_eq!(d.flags, flags_of(&by_share));
        assert_eq!(d.slot[5], -1, "the column with a value out of range");
        // Auto: column 4's fractions make the flags "not 8-bit, not half" (three passes).
        let passes = 3.0;
        let auto: Vec<usize> = order
            .iter()
            .copied()
            .take_while(|&c| share(c) * share(c) > DENSE_MAC_COST * passes)
            .collect();
        assert!(auto.len() >= 3, "{auto:?}");
        let d = choose_dense_columns(&right, &columns, DenseColumnChoice::Auto, u64::MAX)
            .expect("three columns in every row");
        assert_eq!(d.count, auto.len());
        for (i, &c) in auto.iter().enumerate() {
            assert_eq!(d.slot[c], i as i32, "column {c}");
        }
        assert_eq!(d.flags, flags_of(&auto));
    }
}
