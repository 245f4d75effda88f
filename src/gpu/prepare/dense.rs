//! The right side's dense columns: which columns are multiplied as a dense block on the tensor
//! cores (`choose_dense_columns`, by density, within the choice and the device's memory), the
//! value flags that pick the block's precision (8-bit integers, half, TF32, split TF32), and the
//! block filled on the device from the inverted lists (`fill_dense`).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use datafusion::common::Result;

use super::super::args::DenseFillArgs;
use super::super::device::{cuda_err, Device};
use super::super::kernels::MetricProgram;
use super::super::memory::{addr, upload, zeros};
use super::super::stats::GpuStats;
use super::*;
use crate::vector::SparseBatch;

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

/// The fast copy of a dense block, by its values (`DENSE_FAST_*` in kernels/dense.cu): the
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

/// The dense product's constants as the kernels read them (kernels/dense.cu), so the two sides
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
/// self-joins, BENCHMARKS.md "GPU: dense columns on the tensor cores"): an entry walked ~8e-12 s, a pair finished ~1e-11 s, a
/// half-precision multiply-add 2e-14 s (half a TF32 pass).
pub(super) const DENSE_MAC_COST: f64 = 4e-3;
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
    if choice == crate::options::DenseColumnChoice::Off || right.is_empty() {
        return None;
    }
    let profile = ColumnProfile::of(std::slice::from_ref(right), columns.clone());
    choose_dense_from(&profile, right.len(), choice, max_bytes)
}

/// [`choose_dense_columns`] of a right side of `rows` rows from its profile.
pub(crate) fn choose_dense_from(
    profile: &ColumnProfile,
    rows: usize,
    choice: crate::options::DenseColumnChoice,
    max_bytes: u64,
) -> Option<DenseColumns> {
    use crate::options::DenseColumnChoice;
    if choice == DenseColumnChoice::Off || rows == 0 {
        return None;
    }
    let (counts, bad) = (&profile.counts, &profile.bad);
    let ncols = counts.len();
    let any_bad = bad.iter().any(|&b| b);
    let all_flags = profile.flags.iter().fold(0, |f, g| f | g);
    // The flags of the columns in `keep`.
    let flags_of = |keep: &[bool]| -> u32 {
        keep.iter()
            .zip(&profile.flags)
            .fold(0, |f, (&k, &g)| if k { f | g } else { f })
    };
    let mut order: Vec<usize> = (0..ncols).filter(|&c| !bad[c] && counts[c] > 0).collect();
    // On this thread: a build from an index file runs beside the rows' checks, whose blocks
    // held a parallel sort's stolen halves back for 160 ms (the sort alone takes milliseconds).
    order.sort_unstable_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
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

/// The part's dense block, made on the device from its inverted lists (`dense_fill`).
pub(super) fn fill_dense(
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
