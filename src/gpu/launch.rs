//! One launch: a chunk of left rows against one part of the right side, on the device. Fills the
//! kernel's argument struct, launches, times it with events, and assembles the pairs.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use datafusion::common::{exec_err, Result};
use rayon::prelude::*;

use super::args::{DenseArgs, FoldedArgs};
use super::device::{cuda_err, Device};
use super::kernels::{MetricProgram, FOLDED_THREADS};
use super::memory::{addr, download, upload, zeros};
use super::prepare::{
    dense_bytes_per_left_row, dense_value_ok, max_ranks, ColumnMap, DevDense, DevPart, FastKind,
    DENSE_GEMM_SMEM, DENSE_NOT_HALF, DENSE_NOT_INT8, DENSE_NOT_TF32, DENSE_TILE_M, DENSE_TILE_N,
    TOP_VALUES,
};
use super::stats::GpuStats;
use crate::join::{PairList, ProbeOptions, Selection};
use crate::metric::KeyForm;
use crate::vector::SparseBatch;

/// Room for this many radius pairs per left row before a join has found any.
pub(crate) const DEFAULT_RADIUS_PAIRS_PER_ROW: u64 = 64;

/// `self_first` when exclude_self is off (the kernels' NO_SELF).
const NO_SELF: i64 = i64::MIN;

/// Candidate-buffer entries for a top-k of `k`: room for k plus one round of the block.
pub(crate) fn cap_for(k: usize, threads: u32) -> usize {
    (k + threads as usize).next_power_of_two()
}

/// Bytes of shared memory the folded kernels use beside the accumulators: the top-k candidates
/// (a 64-bit key, a 32-bit row and, for a metric with a filter, the filter value as a float
/// rounded up, each; see `topk_offer` in kernels/knn.cu) and the segments ([`SEGMENT_SMEM`]).
pub(crate) fn folded_fixed_smem(k: usize, program: &MetricProgram) -> usize {
    cap_for(k, FOLDED_THREADS) * candidate_bytes(program) + SEGMENT_SMEM
}

/// Shared-memory bytes of one top-k candidate without a filter value: its key and row.
const CANDIDATE_BYTES: usize = 12;

/// Shared-memory bytes of one top-k candidate.
fn candidate_bytes(program: &MetricProgram) -> usize {
    CANDIDATE_BYTES + if program.filtered { 4 } else { 0 }
}

/// [`folded_fixed_smem`] less the segment map and the candidates' filter values.
pub(crate) fn folded_smem_without_map(k: usize) -> usize {
    cap_for(k, FOLDED_THREADS) * CANDIDATE_BYTES + SEGMENT_SMEM - SEG_MAP_BYTES
}

/// Entries per thread of the kernels' segment map (`SEG_ITEMS` in kernels/knn.cu).
pub(crate) const SEG_MAP_ITEMS: usize = 4;

/// The segment map's u16 entries, for the whole block.
pub(crate) const SEG_MAP_BYTES: usize = FOLDED_THREADS as usize * 2 * SEG_MAP_ITEMS;

/// Shared memory for the segments of a chunk of left nonzeros: per thread the walk's start and
/// value (8 bytes, one load), offset and rank (4 bytes each), and the segment map.
const SEGMENT_SMEM: usize = FOLDED_THREADS as usize * 16 + SEG_MAP_BYTES;

/// Testing knob: `SPARSE_KNN_GPU_TILE_GROUPS=N` cuts a launch's tiles into at most N groups (1:
/// a block per left row walks every tile, as before groups), so tests can compare both.
fn most_tile_groups() -> usize {
    std::env::var("SPARSE_KNN_GPU_TILE_GROUPS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .map_or(usize::MAX, |n| n.max(1))
}

/// Everything a launch needs that does not change from chunk to chunk of one part.
pub(crate) struct PartLaunch<'a> {
    pub device: &'a Device,
    pub program: &'a MetricProgram,
    pub columns: &'a ColumnMap,
    pub part: &'a DevPart,
    /// The right side's sorted column ids, when columns are not the indices themselves.
    pub col_ids: Option<&'a CudaSlice<i32>>,
    pub first_row: usize,
    pub part_rows: usize,
    pub ntiles: usize,
    pub tile_rows: usize,
    /// The index's device memory budget, and what is already held of it.
    pub budget: u64,
    pub held: u64,
    /// Lower bounds of the distances instead of the distances (certified metrics).
    pub lower_bounds: bool,
    pub max_row_len: i32,
    /// Bound modes: pairs sharing no column are left out (the host computes those exactly).
    pub shared_only: bool,
    /// Radius joins: a radius per left row of the batch instead of the selection's.
    pub row_radius: Option<&'a [f64]>,
    /// The left rows of the batch to compute (all when absent).
    pub active_rows: Option<&'a [bool]>,
    /// Pairs per left row to make room for (updated with what each launch finds).
    pub radius_pairs_per_row: &'a std::sync::atomic::AtomicU64,
    /// With `shared_only`: the device addresses of the one-sided sums of the probe's left rows
    /// (from its first row) and of the index's right rows (from its first row), from which the
    /// kernels take the pairs sharing no column (`FoldedArgs::l_one`).
    pub one_sided: Option<(super::args::DevPtr, super::args::DevPtr)>,
    /// A right-side filter's rows (a masked probe): a bit per row of the part, set where the row
    /// is valid and passes, read by the kernels in place of the part's own valid bits.
    pub valid_bits: Option<&'a CudaSlice<u32>>,
    /// `within=COLUMN`: the device addresses of the groups of the probe's left rows (from its
    /// first row) and of the index's right rows (from its first row).
    pub groups: Option<(super::args::DevPtr, super::args::DevPtr)>,
}

impl PartLaunch<'_> {
    /// Left rows `r0..r1`; `None` when the chunk needs more memory than the budget leaves (the
    /// caller retries with fewer rows).
    pub(crate) fn run(
        &self,
        left: &SparseBatch,
        r0: usize,
        r1: usize,
        selection: Selection,
        options: ProbeOptions,
        stats: &mut GpuStats,
    ) -> Result<Option<PairList>> {
        let (device, program, held) = (self.device, self.program, self.held);
        let entered = std::time::Instant::now();
        // Longest rows first: blocks start roughly in grid order, so a launch no longer ends on
        // a few long rows started last with the rest of the device idle (power-law rows:
        // movielens kernels in 8,192-row launches 2.35 -> 1.91 s on an H200).
        let mut work: Vec<i32> = (r0..r1)
            .filter(|&r| !left.is_null(r) && self.active_rows.is_none_or(|a| a[r]))
            .map(|r| (r - r0) as i32)
            .collect();
        work.sort_by_key(|&w| std::cmp::Reverse(left.row_len(r0 + w as usize)));
        if work.is_empty() {
            return Ok(Some(PairList::default()));
        }
        let nwork = work.len();
        let self_first = match options.exclude_self_from {
            Some(first) => first + r0 as i64 - self.first_row as i64,
            None => NO_SELF,
        };
        let mut bytes = 0u64;
        // The left chunk as slices of the Arrow buffers: offsets are the row pointer.
        let off = &left.offsets()[r0..=r1];
        let (e0, e1) = (off[0] as usize, off[r1 - r0] as usize);
        let prm = program.params;
        let (k, cap, radius) = match selection {
            Selection::Nearest(k) => (k, cap_for(k, FOLDED_THREADS), 0.0),
            Selection::Within(r) => (1, 1, r),
        };
        let knn = matches!(selection, Selection::Nearest(_));
        // Everything this chunk needs at least; over the budget, the caller halves the chunk.
        let entries = (e1 - e0) as u64;
        let needed = nwork as u64 * 4
            + (off.len() as u64 + 2 * entries) * 4
            + if knn {
                nwork as u64 * (k as u64 * 12 + 4)
            } else {
                64 * 16 + 8
            }
            + if program.max_reduction {
                entries + nwork as u64 * TOP_VALUES as u64 * 4
            } else {
                0
            };
        // The dense columns' product, unless a left value lies outside its range (the inverted
        // lists then take those columns too).
        let dense = self.part.dense.as_ref().filter(|_| {
            !self.lower_bounds && !self.shared_only && dense_values_ok(&left.values()[e0..e1])
        });
        let m_pad = (r1 - r0).div_ceil(DENSE_TILE_M) * DENSE_TILE_M;
        let needed = needed + dense.map_or(0, |d| dense_launch_bytes(d, m_pad));
        if held + needed > self.budget && r1 - r0 > 1 {
            return Ok(None);
        }
        let d_work = upload(device, &work, stats)?;
        bytes += nwork as u64 * 4;
        let d_radius = match self.row_radius {
            Some(radii) => {
                let per_work: Vec<f64> = work.iter().map(|&w| radii[r0 + w as usize]).collect();
                bytes += nwork as u64 * 8;
                Some(upload(device, &per_work, stats)?)
            }
            None => None,
        };
        // A block per left row walks every tile of the part in turn: one row against 10M right
        // rows was one SM's work for 100 ms (H200) with the rest of the device idle. Few rows
        // cut the tiles into groups, a block each, so a launch has about two waves of blocks.
        // (Not in the bound modes: their candidate passes keep per-row state across tiles.)
        let groups = if self.lower_bounds || self.shared_only {
            1
        } else {
            (device.sm_count as usize * 8)
                .div_ceil(nwork)
                .clamp(1, self.ntiles.clamp(1, 65_535))
                .min(most_tile_groups())
        };
        stats.most_tile_groups = stats.most_tile_groups.max(groups);
        let slots = nwork * groups;
        let out_rows = zeros::<u32>(device, if knn { slots * k } else { 1 })?;
        let out_dist = zeros::<f64>(device, if knn { slots * k } else { 1 })?;
        let out_count = zeros::<i32>(device, if knn { slots } else { 1 })?;
        let overflow = zeros::<u32>(device, 1)?;
        if knn {
            bytes += slots as u64 * (k as u64 * 12 + 4);
        }
        // Radius: a pair list filled through an atomic counter; rerun with the exact size if full.
        let mut r_cap: u64 = if knn {
            1
        } else {
            // Room for as many pairs per left row as the last launch found (a little more), within
            // what the budget leaves (16 bytes a pair).
            let room = self.budget.saturating_sub(held + needed) / 16 / 2;
            let per_row = self
                .radius_pairs_per_row
                .load(std::sync::atomic::Ordering::Relaxed);
            // (a certified metric's candidate pass finds ~1,150 a row at movielens' full size:
            // 19M for 16K rows, which 2^24 made run twice)
            // Twice the last average: chunks of skewed data differ, and a list that overflows
            // runs the whole launch again.
            ((nwork as u64) * (2 * per_row))
                .clamp(64, 1 << 27)
                .min(room.max(64))
        };

        let d_off = upload(device, off, stats)?;
        let d_idx = upload(device, &left.indices()[e0..e1], stats)?;
        let d_val = upload(device, &left.values()[e0..e1], stats)?;
        bytes += (off.len() + 2 * (e1 - e0)) as u64 * 4;
        // A max: the left entries' ranks in their rows and each work row's largest values.
        let (l_rank, l_top) = if program.max_reduction {
            let (ranks, top) = left_max_ranks(left, r0, &work);
            bytes += (ranks.len() + top.len() * 4) as u64;
            (upload(device, &ranks, stats)?, upload(device, &top, stats)?)
        } else {
            (zeros::<u8>(device, 1)?, zeros::<f32>(device, 1)?)
        };
        // The kernel reads col_ids only in sorted-column mode; it still needs a valid address.
        let dummy_ids;
        let col_ids = match self.col_ids {
            Some(ids) => ids,
            None => {
                dummy_ids = zeros::<i32>(device, 1)?;
                &dummy_ids
            }
        };

        let dense_sums = match dense {
            Some(d) => {
                let chunk = LeftChunk {
                    off: &d_off,
                    base: off[0] as i64,
                    idx: &d_idx,
                    val: &d_val,
                    rows: r1 - r0,
                    col_ids,
                };
                bytes += dense_launch_bytes(d, m_pad);
                Some(self.dense_product(d, &chunk, m_pad, stats)?)
            }
            None => None,
        };

        let mut pairs = PairList::default();
        loop {
            let r_left = zeros::<u32>(device, if knn { 1 } else { r_cap as usize })?;
            let r_right = zeros::<u32>(device, if knn { 1 } else { r_cap as usize })?;
            let r_dist = zeros::<f64>(device, if knn { 1 } else { r_cap as usize })?;
            let r_counter = zeros::<u64>(device, 1)?;
            let run_bytes = bytes + if knn { 0 } else { r_cap * 16 + 8 };
            stats.peak_device_bytes = stats.peak_device_bytes.max(held + run_bytes);
            let name = program.kernel_names()[if knn { 0 } else { 1 }];

            let set_up = entered.elapsed();
            let start = device
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda_err("recording an event"))?;
            {
                let tile_rows = self.tile_rows.min(self.part_rows.div_ceil(32) * 32).max(32);
                let smem = (tile_rows * program.acc_bytes()
                    + if knn {
                        cap * candidate_bytes(program)
                    } else {
                        0
                    }
                    + SEGMENT_SMEM) as u32;
                let f = device.function(program, name, smem)?;
                if log::log_enabled!(log::Level::Debug) {
                    log::debug!(
                        "GPU {} {name}: {nwork} left rows x {} right rows, tile {tile_rows} \
                         ({} tiles), {} registers, {smem} B shared, k {k}",
                        program.name,
                        self.part_rows,
                        self.ntiles,
                        f.num_regs().unwrap_or(-1)
                    );
                }
                let args = FoldedArgs {
                    l_off: addr(device, &d_off),
                    l_base: off[0] as i64,
                    l_idx: addr(device, &d_idx),
                    l_val: addr(device, &d_val),
                    work: addr(device, &d_work),
                    nwork: nwork as i32,
                    n_right: self.part_rows as i32,
                    self_first,
                    valid_bits: match self.valid_bits {
                        Some(bits) => addr(device, bits),
                        None if self.part.all_valid => 0,
                        None => addr(device, &self.part.valid_bits),
                    },
                    rt0: addr(device, &self.part.rt0),
                    rt1: addr(device, &self.part.rt1),
                    key_base: match program.key_form {
                        KeyForm::Quotient => addr(device, &self.part.key_base),
                        KeyForm::Shifted { .. } => addr(device, &self.part.rt0),
                        KeyForm::Negated | KeyForm::Exact => 0,
                    },
                    y_min: self.part.y_min,
                    y_max: self.part.y_max,
                    overflow: addr(device, &overflow),
                    lower_bounds: self.lower_bounds as i32,
                    max_row_len: self.max_row_len,
                    shared_only: self.shared_only as i32,
                    row_radius: d_radius.as_ref().map_or(0, |r| addr(device, r)),
                    col_mode: matches!(self.columns, ColumnMap::Sorted(_)) as i32,
                    ncols: self.columns.len() as i32,
                    col_ids: addr(device, col_ids),
                    tile_ptr: addr(device, &self.part.tile_ptr),
                    col_entries: addr(device, &self.part.col_entries),
                    col_lift: addr(device, &self.part.col_lift),
                    col_ranks: addr(device, &self.part.col_ranks),
                    r_top: addr(device, &self.part.r_top),
                    l_rank: addr(device, &l_rank),
                    l_top: addr(device, &l_top),
                    tile_rows: tile_rows as i32,
                    ntiles: self.ntiles as i32,
                    tile_groups: groups as i32,
                    p: prm.p,
                    d: prm.d,
                    k: k as i32,
                    cap: cap as i32,
                    out_rows: addr(device, &out_rows),
                    out_dist: addr(device, &out_dist),
                    out_count: addr(device, &out_count),
                    radius,
                    r_left: addr(device, &r_left),
                    r_right: addr(device, &r_right),
                    r_dist: addr(device, &r_dist),
                    r_counter: addr(device, &r_counter),
                    r_cap,
                    dense: dense_sums.as_ref().map_or(0, |c| addr(device, c)),
                    dense_stride: dense.map_or(0, |d| d.n_pad as i64),
                    dense_slot: dense.map_or(0, |d| addr(device, &d.slot)),
                    zero_skip: (program.zero_distance.is_some()
                        && !self.lower_bounds
                        && !self.shared_only) as i32,
                    zero_dist: program.zero_distance.unwrap_or(0.0),
                    l_one: self.one_sided.map_or(0, |(l, _)| l + r0 as u64 * 8),
                    r_one: self
                        .one_sided
                        .map_or(0, |(_, r)| r + self.first_row as u64 * 8),
                    l_group: self.groups.map_or(0, |(l, _)| l + r0 as u64 * 4),
                    r_group: self
                        .groups
                        .map_or(0, |(_, r)| r + self.first_row as u64 * 4),
                };
                let cfg = LaunchConfig {
                    grid_dim: (nwork as u32, groups as u32, 1),
                    block_dim: (FOLDED_THREADS, 1, 1),
                    shared_mem_bytes: smem,
                };
                let mut b = device.stream.launch_builder(&f);
                b.arg(&args);
                // SAFETY: `FoldedArgs` is the kernel's one parameter (its CUDA declaration is
                // generated from the Rust struct, with offsets checked); the tiles were cut with
                // the same tile_rows (prepare_part), so tile_ptr has ntiles + 1 per column; every
                // buffer outlives the launch (the event below is waited on before they drop).
                unsafe { b.launch(cfg) }.map_err(cuda_err("launching the kernel"))?;
            }
            let end = device
                .stream
                .record_event(Some(crate::gpu::device::WAITED_EVENT))
                .map_err(cuda_err("recording an event"))?;
            end.synchronize().map_err(cuda_err("running the kernel"))?;
            let ms = start
                .elapsed_ms(&end)
                .map_err(cuda_err("timing the kernel"))?;
            stats.kernel_nanos += (ms as f64 * 1e6) as u64;
            let ran = entered.elapsed();

            if download(device, &overflow, 1)?[0] != 0 {
                return exec_err!(
                    "GPU: a pair term of metric {} exceeded the bound its fixed-point sums were \
                     scaled for (the definition's terms must be monotone in |y|)",
                    program.name
                );
            }
            if knn {
                let counts = download(device, &out_count, slots)?;
                let rows = download(device, &out_rows, slots * k)?;
                let dists = download(device, &out_dist, slots * k)?;
                pairs = nearest_of_groups(
                    &GroupLists {
                        counts: &counts,
                        rows: &rows,
                        dists: &dists,
                        k,
                        groups,
                    },
                    &work,
                    r0,
                    self.first_row,
                    program.similarity,
                );
                log::debug!(
                    "GPU {} launch of {nwork} left rows x {groups} tile groups: set up {set_up:?}, \
                     kernel done {:?} (its events {ms:.3} ms), answers {:?}",
                    program.name,
                    ran - set_up,
                    entered.elapsed() - ran
                );
                break;
            }
            let found = download(device, &r_counter, 1)?[0];
            if found > r_cap {
                let room = self.budget.saturating_sub(held + bytes + 4096) / 16;
                if found > room && r1 - r0 > 1 {
                    // More pairs than the budget holds: the caller retries with fewer left rows.
                    return Ok(None);
                }
                // The pair list overflowed: run again with room for every pair.
                log::debug!("radius pairs: {found} found, room for {r_cap}: running again");
                r_cap = found;
                continue;
            }
            let n = found as usize;
            self.radius_pairs_per_row.store(
                (found / nwork.max(1) as u64).max(DEFAULT_RADIUS_PAIRS_PER_ROW),
                std::sync::atomic::Ordering::Relaxed,
            );
            // Offsets added in place: a certified metric's candidates are ~19M pairs a launch,
            // where each copy of the lists cost tens of milliseconds.
            pairs.left = download(device, &r_left, n)?;
            pairs.right = download(device, &r_right, n)?;
            let (first_left, first_right) = (r0 as u32, self.first_row as u32);
            add_to_each(&mut pairs.left, first_left);
            add_to_each(&mut pairs.right, first_right);
            pairs.distance = if self.lower_bounds {
                // Candidates' lower bounds: the exact step computes every candidate's distance
                // and reads only its rows, so the bounds stay on the device.
                vec![0.0; 0]
            } else {
                download(device, &r_dist, n)?
            };
            break;
        }
        Ok(Some(pairs))
    }
}

/// Device bytes of a launch's dense product for `m_pad` left rows: A and its fast copy, C, and
/// A's value flags.
fn dense_launch_bytes(dense: &DevDense, m_pad: usize) -> u64 {
    m_pad as u64 * dense_bytes_per_left_row(dense.kp, dense.fast_kind, dense.n_pad) + 4
}

/// A left chunk on the device, as the kernels read it.
struct LeftChunk<'a> {
    off: &'a CudaSlice<i32>,
    base: i64,
    idx: &'a CudaSlice<i32>,
    val: &'a CudaSlice<f32>,
    rows: usize,
    col_ids: &'a CudaSlice<i32>,
}

impl PartLaunch<'_> {
    /// The chunk's sums over the dense columns against every right row of the part, C = A·Bᵀ on
    /// the tensor cores (`m_pad` x the part's padded rows, float32; see `dense_gemm`).
    fn dense_product(
        &self,
        dense: &DevDense,
        chunk: &LeftChunk<'_>,
        m_pad: usize,
        stats: &mut GpuStats,
    ) -> Result<CudaSlice<f32>> {
        let (device, program) = (self.device, self.program);
        let a = zeros::<f32>(device, m_pad * dense.kp)?;
        let a_fast = zeros::<u8>(device, m_pad * dense.kp * dense.fast_kind.bytes())?;
        // SAFETY: every element of C is written by `dense_gemm` (its grid covers m_pad x n_pad
        // exactly) before the folded kernels read it, on the same stream.
        let c = unsafe { device.stream.alloc::<f32>(m_pad * dense.n_pad) }
            .map_err(cuda_err("allocating device memory"))?;
        let a_flags = zeros::<u32>(device, 1)?;
        let args = DenseArgs {
            l_off: addr(device, chunk.off),
            l_base: chunk.base,
            l_idx: addr(device, chunk.idx),
            l_val: addr(device, chunk.val),
            rows: chunk.rows as i32,
            col_mode: matches!(self.columns, ColumnMap::Sorted(_)) as i32,
            ncols: self.columns.len() as i32,
            col_ids: addr(device, chunk.col_ids),
            dense_slot: addr(device, &dense.slot),
            a: addr(device, &a),
            a_fast: addr(device, &a_fast),
            b: addr(device, &dense.block),
            b_fast: dense.fast.as_ref().map_or(0, |b| addr(device, b)),
            c: addr(device, &c),
            kp: dense.kp as i32,
            n_pad: dense.n_pad as i32,
            a_flags: addr(device, &a_flags),
            b_flags: dense.flags as i32,
            fast_kind: dense.fast_kind as i32,
        };
        let start = device
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("recording an event"))?;
        let scatter = device.function(program, "dense_scatter", 0)?;
        let warps_per_block = 8;
        let cfg = LaunchConfig {
            grid_dim: (
                chunk.rows.div_ceil(warps_per_block).min(65_535) as u32,
                1,
                1,
            ),
            block_dim: (32 * warps_per_block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = device.stream.launch_builder(&scatter);
        b.arg(&args);
        // SAFETY: `DenseArgs` is the kernel's one parameter (its CUDA twin generated from it);
        // A holds m_pad >= rows rows of kp, every slot is below kp; the buffers outlive the
        // launch (the caller waits on the stream before they drop).
        unsafe { b.launch(cfg) }.map_err(cuda_err("launching the kernel"))?;
        let gemm = device.function(program, "dense_gemm", DENSE_GEMM_SMEM)?;
        let cfg = LaunchConfig {
            grid_dim: (
                (dense.n_pad / DENSE_TILE_N) as u32,
                (m_pad / DENSE_TILE_M) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: DENSE_GEMM_SMEM,
        };
        let mut b = device.stream.launch_builder(&gemm);
        b.arg(&args);
        // SAFETY: as above; A is m_pad x kp, B n_pad x kp, C m_pad x n_pad, all multiples of the
        // kernel's tiles (m_pad of DENSE_TILE_M, n_pad of DENSE_TILE_N, kp of DENSE_TILE_K).
        unsafe { b.launch(cfg) }.map_err(cuda_err("launching the kernel"))?;
        let end = device
            .stream
            .record_event(Some(crate::gpu::device::WAITED_EVENT))
            .map_err(cuda_err("recording an event"))?;
        end.synchronize()
            .map_err(cuda_err("running the dense product"))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(cuda_err("timing the kernel"))?;
        stats.kernel_nanos += (ms as f64 * 1e6) as u64;
        if log::log_enabled!(log::Level::Debug) {
            let flags = download(device, &a_flags, 1)?[0] | dense.flags;
            log::debug!(
                "GPU {} dense_gemm: {} left rows x {} right rows x {} columns ({}): {ms:.2} ms",
                program.name,
                chunk.rows,
                self.part_rows,
                dense.kp,
                if dense.fast_kind == FastKind::Int8 && flags & DENSE_NOT_INT8 == 0 {
                    "8-bit"
                } else if dense.fast_kind == FastKind::Half && flags & DENSE_NOT_HALF == 0 {
                    "half"
                } else if flags & DENSE_NOT_TF32 == 0 {
                    "TF32"
                } else {
                    "3xTF32"
                },
            );
        }
        Ok(c)
    }
}

/// A max's left inputs for rows `r0..` of `left` (`work` relative to r0): each entry's rank in its
/// row (aligned with the chunk's entries) and each work row's largest values (see `max_ranks`).
fn left_max_ranks(left: &SparseBatch, r0: usize, work: &[i32]) -> (Vec<u8>, Vec<f32>) {
    let r1 = r0 + work.iter().map(|&w| w as usize + 1).max().unwrap_or(0);
    let base = left.offsets()[r0] as usize;
    let end = left.offsets()[r1.max(r0)] as usize;
    let mut ranks = vec![255u8; end - base];
    let mut top = vec![0f32; work.len() * TOP_VALUES];
    let mut per_row: Vec<(usize, &mut [u8])> = Vec::with_capacity(r1 - r0);
    let mut rest = &mut ranks[..];
    for r in r0..r1 {
        let (row, tail) = rest.split_at_mut(left.row_len(r));
        per_row.push((r, row));
        rest = tail;
    }
    let tops: Vec<[f32; TOP_VALUES]> = per_row
        .into_par_iter()
        .map_init(Vec::new, |buffer, (r, out)| {
            let mut row_top = [0f32; TOP_VALUES];
            max_ranks(left.row(r).1, buffer, &mut row_top);
            out.copy_from_slice(buffer);
            row_top
        })
        .collect();
    for (w, &in_chunk) in work.iter().enumerate() {
        top[w * TOP_VALUES..(w + 1) * TOP_VALUES].copy_from_slice(&tops[in_chunk as usize]);
    }
    (ranks, top)
}

/// A launch's answers as the kernels left them: per slot (tile group `g`, work row `w`: slot
/// `g * nwork + w`) a count and up to `k` (right row, distance) candidates.
struct GroupLists<'a> {
    counts: &'a [i32],
    rows: &'a [u32],
    dists: &'a [f64],
    k: usize,
    groups: usize,
}

/// Each work row's k nearest over its tile groups' candidates, in left row order then rank,
/// ties by right row: `merge_nearest`'s answer, without a pair list per group and one sort of
/// all candidates per row (a row against 11M right rows has 1,056 groups: 10,560 candidates,
/// whose lists and sort held the lane 1.7 ms, three times the kernel).
fn nearest_of_groups(
    lists: &GroupLists<'_>,
    work: &[i32],
    r0: usize,
    first_row: usize,
    similarity: bool,
) -> PairList {
    let (nwork, k) = (work.len(), lists.k);
    if k == 0 {
        return PairList::default();
    }
    let mut by_row: Vec<usize> = (0..nwork).collect();
    by_row.sort_unstable_by_key(|&w| work[w]);
    let mut out = PairList::with_capacity(nwork * k);
    let mut candidates: Vec<(f64, u32)> = Vec::with_capacity(lists.groups * k);
    let order = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    for &w in &by_row {
        candidates.clear();
        for g in 0..lists.groups {
            let slot = g * nwork + w;
            let found = lists.counts[slot].max(0) as usize;
            for i in slot * k..slot * k + found {
                let d = lists.dists[i];
                candidates.push((if similarity { -d } else { d }, lists.rows[i]));
            }
        }
        if candidates.len() > k {
            candidates.select_nth_unstable_by(k - 1, order);
            candidates.truncate(k);
        }
        candidates.sort_unstable_by(order);
        let lrow = (r0 + work[w] as usize) as u32;
        for &(key, row) in &candidates {
            out.push(
                lrow,
                first_row as u32 + row,
                if similarity { -key } else { key },
            );
        }
    }
    out
}

/// Whether every value of a launch's left rows lies in the dense product's range: a lookup's
/// few values on the calling thread (waking the pool's threads for them cost more than the check:
/// a server's lookups each launch one), a batch's on every core.
fn dense_values_ok(values: &[f32]) -> bool {
    if values.len() < crate::vector::SMALL_ENTRIES {
        values.iter().all(|&v| dense_value_ok(v))
    } else {
        values.par_iter().all(|&v| dense_value_ok(v))
    }
}

/// `offset` added to each of a launch's row numbers (in place), on the calling thread where a
/// lookup's few pairs do not pay for the pool.
fn add_to_each(rows: &mut [u32], offset: u32) {
    if offset == 0 {
        return;
    }
    if rows.len() < crate::vector::SMALL_ENTRIES {
        rows.iter_mut().for_each(|r| *r += offset);
    } else {
        rows.par_iter_mut().for_each(|r| *r += offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::join::merge_nearest;

    /// Random per-group candidate lists (few distinct distances, so ties across groups) answer
    /// as the per-group pair lists merged by `merge_nearest`, for distances and similarities.
    #[test]
    fn nearest_of_groups_is_the_merge_of_the_groups_lists() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for (nwork, groups, k) in [(1, 1056, 10), (5, 212, 10), (3, 7, 4), (4, 1, 3), (2, 9, 1)] {
            for similarity in [false, true] {
                let slots = nwork * groups;
                let mut counts = vec![0i32; slots];
                let mut rows = vec![0u32; slots * k];
                let mut dists = vec![0f64; slots * k];
                for slot in 0..slots {
                    let g = slot / nwork;
                    counts[slot] = next(k as u64 + 1) as i32;
                    // Right rows of group g are its own (groups are disjoint tiles), each
                    // slot's list in rank order as the kernels leave it.
                    let mut list: Vec<(f64, u32)> = (0..counts[slot] as usize)
                        .map(|i| {
                            let row = g * 1000 + next(100) as usize * 10 + i;
                            (next(5) as f64 * 0.25, row as u32)
                        })
                        .collect();
                    list.sort_by(|a, b| {
                        let key = |d: f64| if similarity { -d } else { d };
                        key(a.0).total_cmp(&key(b.0)).then(a.1.cmp(&b.1))
                    });
                    for (i, (d, r)) in list.into_iter().enumerate() {
                        rows[slot * k + i] = r;
                        dists[slot * k + i] = d;
                    }
                }
                // Work rows in launch order (longest first), not left row order.
                let work: Vec<i32> = (0..nwork as i32).rev().collect();
                let (r0, first_row) = (3, 500);
                let got = nearest_of_groups(
                    &GroupLists {
                        counts: &counts,
                        rows: &rows,
                        dists: &dists,
                        k,
                        groups,
                    },
                    &work,
                    r0,
                    first_row,
                    similarity,
                );
                let mut by_row: Vec<usize> = (0..nwork).collect();
                by_row.sort_unstable_by_key(|&w| work[w]);
                let per_group = (0..groups)
                    .map(|g| {
                        let mut list = PairList::default();
                        for &w in &by_row {
                            let slot = g * nwork + w;
                            for i in 0..counts[slot] as usize {
                                list.push(
                                    (r0 + work[w] as usize) as u32,
                                    first_row as u32 + rows[slot * k + i],
                                    dists[slot * k + i],
                                );
                            }
                        }
                        list
                    })
                    .collect();
                let wanted = merge_nearest(per_group, k, similarity);
                assert_eq!(got.left, wanted.left, "{nwork} x {groups}, k {k}");
                assert_eq!(got.right, wanted.right, "{nwork} x {groups}, k {k}");
                assert_eq!(got.distance, wanted.distance, "{nwork} x {groups}, k {k}");
            }
        }
    }
}
