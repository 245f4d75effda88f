//! The right side prepared on the host for the device: an inverted index cut in tiles (and for a
//! max, each row's largest values and every entry's rank in its row), or, for a right side that
//! stays whole on the device, everything but the index, which the device builds (`lists`).
//!
//! - this file: the layout (column map, tiles, row totals, a max's ranks, the part's sizes);
//! - `dense.rs`: the dense columns multiplied on the tensor cores;
//! - `profile.rs`: the column map and each column's counts and value flags (one pass, or kept
//!   in an index file);
//! - `upload.rs`: a prepared part moved to the device.

use cudarc::driver::CudaSlice;
use rayon::prelude::*;

use super::kernels::MetricProgram;
use crate::metric::{KeyForm, RowTotals};
use crate::vector::SparseBatch;

mod dense;
mod profile;
#[cfg(test)]
mod tests;
mod upload;

pub(crate) use dense::*;
pub(crate) use profile::ColumnProfile;
pub(crate) use upload::*;

/// Maps a column index to a column id of the right side.
#[derive(Debug, Clone, PartialEq)]
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
    /// A lifted metric ([`MetricProgram::lifted`]): the device keeps each entry's lift beside
    /// the entries (8 bytes each), computed there once the lists are ([`upload_part`]).
    pub(crate) entry_lifts: bool,
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

    /// The inverted lists' entries, built on the host or left for the device.
    pub(crate) fn entries(&self) -> usize {
        self.device_lists
            .map_or(self.col_entries.len(), |lists| lists.entries)
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
            + usize::from(self.entry_lifts) * 8 * self.entries()
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
    /// Each entry's lift, for a lifted metric (empty otherwise; see [`HostPart::entry_lifts`]).
    pub(crate) col_lift: CudaSlice<f64>,
    pub(crate) y_min: f64,
    pub(crate) y_max: f64,
    pub(crate) bytes: u64,
    /// The dense columns' block on the device (see [`HostPart::dense_block`]).
    pub(crate) dense: Option<DevDense>,
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
    // (a lifted metric's entries carry their lifts: 8 bytes more each)
    nnz * if program.lifted { 16 } else { 8 }
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
        entry_lifts: program.lifted,
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
