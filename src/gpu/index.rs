//! The right side of a join on the GPU, and probing it with left batches.
//!
//! The right side is prepared once (see `prepare`): an inverted index (CSC: column → (row,
//! value) list, row-sorted when the host builds it; built on the device from the rows when the
//! right side stays whole there, see `lists`), the split point of every column at every tile
//! boundary, the per-row totals and a validity bitmask (for a max, also each entry's rank in its
//! row and each row's largest values); certified metrics also keep the rows on the host for
//! their exact step (`metric::ExactRows`). It stays on the device while left batches stream
//! through; a left batch goes up as the Arrow buffers' own slices (the list offsets are the CSR
//! row pointer). When the right side does not fit the memory budget it is cut into parts by rows
//! that are uploaded one at a time per probe, and the parts' results are merged by the join core.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;
use datafusion::common::{exec_datafusion_err, exec_err, Result};
use rayon::prelude::*;

use super::device::{cuda_err, is_out_of_memory, Device, Lanes};
use super::kernels::MetricProgram;
use super::launch::{
    folded_fixed_smem, folded_smem_without_map, PartLaunch, DEFAULT_RADIUS_PAIRS_PER_ROW,
};
use super::lists::{self, ListSource};
use super::memory::upload;
use super::prepare::{
    choose_dense_columns, dense_bytes_per_left_row, estimate_bytes, fast_kind, prepare_part,
    upload_part, ColumnMap, DenseColumns, DevPart, HostPart, PartShape, DENSE_TILE_N,
};
use super::stats::{record_process_stats, GpuOptions, GpuStats};
use crate::join::{merge_nearest, merge_within, Cancel, PairList, ProbeOptions, Selection, TopK};
use crate::metric::{sorted_nonzeros, ExactRows, RowTotals, Semiring};
use crate::vector::SparseBatch;

/// The largest k selected inside the kernels (the candidates live in shared memory); a larger k
/// is selected on the host from every pair's distance, still computed on the device.
pub(crate) const MAX_DEVICE_K: usize = 1024;
/// Left rows per launch, at most (bounded further by the memory budget).
const MAX_CHUNK_ROWS: usize = 1 << 18;
/// Device bytes of one launch's dense product (see `chunk_end`), at most.
const DENSE_LAUNCH_BYTES: u64 = 4 << 30;

/// Mutable state of an index: resident buffers and counters, behind one lock (probes of one
/// index are serialised; they also take the device's lock).
struct Inner {
    resident: Option<Vec<DevPart>>,
    col_ids: Option<CudaSlice<i32>>,
    /// Device bytes held by this index between probes.
    resident_bytes: u64,
    /// Pairs per left row the last radius launch found: the next one sizes its pair list by it,
    /// so a join whose rows match hundreds (a certified metric's candidates) runs each kernel
    /// once instead of overflowing a default list and running again.
    radius_pairs_per_row: AtomicU64,
}

/// The right side of a join, resident on the device (or streamed in parts).
pub struct GpuIndex {
    program: MetricProgram,
    device: Arc<Device>,
    rows: usize,
    columns: ColumnMap,
    /// Host copies of the parts; kept only when the parts do not all stay on the device.
    host_parts: Option<Vec<HostPart>>,
    parts_meta: Vec<(usize, usize, usize)>, // (first_row, rows, ntiles)
    tile_rows: usize,
    budget: u64,
    /// Right columns multiplied on the tensor cores.
    dense_count: usize,
    /// Device bytes per left row of a launch for the dense columns' product (its row of A and
    /// of C = A·Bᵀ); 0 without dense columns.
    dense_row_bytes: u64,
    /// The most nonzeros of one right row (in the certified bounds).
    max_row_len: i32,
    /// Certified metrics: the exact distance of a pair (left row, right row) over the union.
    /// Shared by the replicas of one right side on several GPUs.
    exact: Option<Arc<ExactRows>>,
    /// Read by probes at once, each on a lane of the device.
    inner: Inner,
    stats: Mutex<GpuStats>,
}

/// What the kernels return for a certified metric: distances, or their lower bounds; and for
/// radius joins, a radius per left row.
#[derive(Clone, Copy)]
struct Bounds<'a> {
    lower: bool,
    row_radius: Option<&'a [f64]>,
    /// Leave out the pairs that share no column (their distances come from the host).
    shared_only: bool,
    /// The left rows to compute (all when absent).
    active_rows: Option<&'a [bool]>,
}

impl Bounds<'_> {
    const NONE: Bounds<'static> = Bounds {
        lower: false,
        row_radius: None,
        shared_only: false,
        active_rows: None,
    };
}

impl std::fmt::Debug for GpuIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuIndex")
            .field("device", &self.device)
            .field("metric", &self.program.name)
            .field("rows", &self.rows)
            .field("parts", &self.parts_meta.len())
            .field("tile_rows", &self.tile_rows)
            .finish()
    }
}

/// What a build settles before it prepares anything: the kernels, the column ids, the tile
/// height and the parts (row ranges) of the right side.
#[derive(Clone)]
struct Layout {
    program: MetricProgram,
    columns: ColumnMap,
    tile_rows: usize,
    budget: u64,
    ranges: Vec<(usize, usize)>,
    /// Bilinear metrics on tensor cores: the columns multiplied as a dense block.
    dense: Option<DenseColumns>,
    /// The one part's inverted lists are built on the device ([`super::lists`]).
    lists_on_device: bool,
}

impl Layout {
    fn of<S: Semiring>(
        device: &Device,
        right: &SparseBatch,
        s: &S,
        budget: u64,
        options: &GpuOptions,
    ) -> Self {
        let started = std::time::Instant::now();
        let program = MetricProgram::of(s);
        let rows = right.len();
        // Column ids: the indices themselves when the index space is not much larger than the
        // data, else the sorted distinct indices (found by binary search on the device).
        let nnz_nonzero = right.values().par_iter().filter(|v| **v != 0.0).count();
        let max_dim = right.max_dim();
        let columns = if max_dim <= 4 * nnz_nonzero + (1 << 20) {
            ColumnMap::Direct(max_dim)
        } else {
            let mut ids: Vec<i32> = (0..rows)
                .flat_map(|r| {
                    let (i, v) = right.row(r);
                    i.iter().zip(v).filter(|(_, v)| **v != 0.0).map(|(i, _)| *i)
                })
                .collect();
            ids.par_sort_unstable();
            ids.dedup();
            ColumnMap::Sorted(ids)
        };
        log::debug!(
            "GPU index: program and column map in {:?}",
            started.elapsed()
        );
        let tile_rows = tile_rows(device, &program);
        // Dense columns take at most a fifth of the budget (each probe's product needs room
        // too); none when the right side is streamed in parts anyway.
        let choosing = std::time::Instant::now();
        let dense = (program.bilinear && device.tensor_cores)
            .then(|| {
                let d = choose_dense_columns(right, &columns, options.dense_columns, budget / 5);
                log::debug!(
                    "GPU index: dense columns chosen in {:?}",
                    choosing.elapsed()
                );
                d
            })
            .flatten()
            .filter(|d| {
                estimate_bytes(right, 0, rows, &program, &columns, tile_rows, Some(d))
                    <= budget / 10 * 6
            });
        if let Some(d) = &dense {
            log::debug!(
                "GPU index: {} dense columns (of {}) on the tensor cores",
                d.count,
                columns.len()
            );
        }

        // Parts: one when the prepared right side fits in 60% of the budget (the rest is for
        // probes); otherwise parts of at most 30% each, streamed per probe.
        let total_estimate = estimate_bytes(
            right,
            0,
            rows,
            &program,
            &columns,
            tile_rows,
            dense.as_ref(),
        );
        let part_limit = if total_estimate <= budget / 10 * 6 {
            u64::MAX
        } else {
            budget / 10 * 3
        };
        let mut ranges = Vec::new();
        let mut start = 0;
        while start < rows {
            let mut end = rows;
            if part_limit != u64::MAX {
                // Grow the part row by row until the estimate passes the limit.
                let per_row = 4 + program.acc_bytes() as u64 * 2;
                let fixed = columns.len() as u64 * 8 + 1024;
                let mut bytes = fixed;
                end = start;
                while end < rows {
                    let b = right.row(end).0.len() as u64 * 16 + per_row;
                    if bytes + b > part_limit && end > start {
                        break;
                    }
                    bytes += b;
                    end += 1;
                }
            }
            ranges.push((start, end));
            start = end;
        }
        // A part held whole builds its lists on the device when the CSR and the counters fit
        // beside it.
        let lists_on_device = ranges.len() == 1
            && rows > 0
            && columns.len() > 0
            && lists::on_device_allowed()
            && total_estimate
                + lists::scratch_bytes(
                    right,
                    0,
                    rows,
                    columns.len(),
                    rows.div_ceil(tile_rows),
                    program.max_reduction,
                )
                <= budget / 10 * 8;
        Layout {
            program,
            columns,
            tile_rows,
            budget,
            ranges,
            dense,
            lists_on_device,
        }
    }

    /// [`Layout::prepare`], and a certified metric's exact rows (host work too) built beside it.
    fn prepare_with_exact<S: Semiring>(
        &self,
        right: &SparseBatch,
        s: &S,
    ) -> (Option<Arc<ExactRows>>, Vec<HostPart>) {
        rayon::join(
            || {
                self.program
                    .certified
                    .then(|| Arc::new(ExactRows::new(*s, right)))
            },
            || self.prepare(right, s),
        )
    }

    /// The parts as the kernels read them, on the host.
    fn prepare<S: Semiring>(&self, right: &SparseBatch, s: &S) -> Vec<HostPart> {
        let totals: Vec<RowTotals> = (0..right.len())
            .into_par_iter()
            .map(|r| s.totals(right.row(r).1.iter().copied().filter(|x| *x != 0.0)))
            .collect();
        self.ranges
            .par_iter()
            .map(|&(a, b)| {
                prepare_part(
                    right,
                    &totals,
                    a,
                    b,
                    &PartShape {
                        program: &self.program,
                        columns: &self.columns,
                        tile_rows: self.tile_rows,
                        dense: self.dense.as_ref(),
                        lists_on_device: self.lists_on_device,
                    },
                )
            })
            .collect()
    }
}

/// Where each left row's pairs start in a list of `rows` left rows grouped by left row (or
/// where they go, for a counting sort of an ungrouped list).
fn left_row_starts(left_of_pair: &[u32], rows: usize) -> Vec<usize> {
    let mut starts = vec![0usize; rows + 1];
    for &l in left_of_pair {
        starts[l as usize + 1] += 1;
    }
    for l in 0..rows {
        starts[l + 1] += starts[l];
    }
    starts
}

/// Adds the exact distances of left row `l` to the right rows `candidates` to its `row`.
fn add_exact(
    exact: &ExactRows,
    left: &SparseBatch,
    l: usize,
    candidates: &[u32],
    row: &mut Vec<(f64, u32)>,
) {
    if candidates.is_empty() {
        return;
    }
    let x = sorted_nonzeros(left.row(l));
    let x_one_sided = exact.left_one_sided(&x);
    row.extend(
        candidates
            .iter()
            .map(|&j| (exact.distance(&x, x_one_sided, j as usize), j)),
    );
}

/// A row's exact pairs cut to the answer: the k nearest, or those within the radius by right row.
/// A right row can come twice only through a column the kernels saw and the exact rows do not
/// (an explicit zero); it has one distance either way.
fn keep_answer(row: &mut Vec<(f64, u32)>, selection: Selection) {
    match selection {
        Selection::Nearest(k) => {
            row.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            row.dedup();
            row.truncate(k);
        }
        Selection::Within(radius) => {
            row.retain(|&(d, _)| d <= radius);
            row.sort_unstable_by_key(|e| e.1);
            row.dedup();
        }
    }
}

fn into_pairs(rows: Vec<Vec<(f64, u32)>>) -> PairList {
    let mut out = PairList::default();
    for (l, row) in rows.into_iter().enumerate() {
        for (d, j) in row {
            out.push(l as u32, j, d);
        }
    }
    out
}

/// How tight the bounds were (a candidate costs a merge of two rows on the host) and how many
/// rows needed the candidate pass; `timing` is when the disjoint rows and the first pass ended.
fn log_certified(
    left_rows: usize,
    first_pairs: usize,
    (second_rows, candidates): (usize, usize),
    rows: &[Vec<(f64, u32)>],
    started: std::time::Instant,
    [disjoint_s, first_s]: [f64; 2],
) {
    log::debug!(
        "certified: {left_rows} left rows, {} kept; rows sharing no column {disjoint_s:.3} s; \
         first pass {first_pairs} pairs, {:.3} s; candidate pass over {second_rows} rows, \
         {candidates} candidates; {:.3} s in all",
        rows.iter().map(Vec::len).sum::<usize>(),
        first_s - disjoint_s,
        started.elapsed().as_secs_f64()
    );
}

/// Right rows per tile of the folded kernels on `device`.
fn tile_rows(device: &Device, program: &MetricProgram) -> usize {
    // Four blocks per SM: measured on an H200 (full self-joins, k=10), a quarter of the
    // SM's shared memory per block (8,448 float rows per tile) beat half of it (23,232
    // rows) by 1.5x on scrna and 1.25x on movielens: more warps in flight hide the
    // latency of the inverted lists and the shared-memory atomics.
    let per_block =
        (device.smem_optin as usize).min((device.smem_per_sm as usize / 4).saturating_sub(1024));
    // The segment map's 4 KB and the candidates' filter values (4 KB up to k = 512) come out of
    // the slack that a top-k below MAX_DEVICE_K leaves (the candidate buffer is sized for k at
    // launch): counted here, they would cut every tile by a third for all k. The block must
    // still fit the device's limit at MAX_DEVICE_K.
    let avail = per_block
        .saturating_sub(folded_smem_without_map(MAX_DEVICE_K) + 256)
        .min(
            (device.smem_optin as usize)
                .saturating_sub(folded_fixed_smem(MAX_DEVICE_K, program) + 256),
        );
    let mut t = (avail / program.acc_bytes()) / 32 * 32;
    if let Some(forced) = std::env::var("SPARSE_KNN_GPU_TILE_ROWS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        // Testing knob: small tiles exercise the tile boundaries on small inputs.
        t = t.min(forced.max(32) / 32 * 32);
    }
    t.max(32)
}

/// The kernels count right rows in `int` (and pack them in 32 bits of a key) and address the
/// inverted index with u32 positions.
fn check_size(right: &SparseBatch) -> Result<()> {
    if right.len() > i32::MAX as usize || right.nnz() > u32::MAX as usize {
        return exec_err!(
            "GPU: the right side is too large ({} rows, {} entries; the kernels take at \
             most {} rows and {} entries); use device=cpu",
            right.len(),
            right.nnz(),
            i32::MAX,
            u32::MAX
        );
    }
    Ok(())
}

/// Where an upload put the right side.
struct Uploaded {
    /// The right side's one part (None when its parts are streamed per probe).
    resident: Option<Vec<DevPart>>,
    /// Its parts, kept on the host when they are streamed (set by the caller, who owns them).
    host_parts: Option<Vec<HostPart>>,
    col_ids: Option<CudaSlice<i32>>,
    resident_bytes: u64,
}

/// Uploads the prepared right side to `device`: the column ids and `resident`, the one part
/// that stays (None when there are several parts: they stay on the host, streamed per probe).
fn upload_layout(
    device: &Device,
    layout: &Layout,
    right: &SparseBatch,
    resident: Option<&HostPart>,
    stats: &mut GpuStats,
) -> Result<Uploaded> {
    let (program, columns) = (&layout.program, &layout.columns);
    device
        .ctx
        .bind_to_thread()
        .map_err(cuda_err("binding the CUDA context"))?;
    let (col_ids, col_bytes) = match columns {
        ColumnMap::Sorted(ids) => (Some(upload(device, ids, stats)?), ids.len() as u64 * 4),
        ColumnMap::Direct(_) => (None, 0),
    };
    // (the lists' build holds its scratch beside the part for a moment)
    let scratch = resident
        .filter(|part| part.device_lists.is_some())
        .map_or(0, |part| {
            let end = part.first_row + part.rows;
            let max = program.max_reduction;
            lists::scratch_bytes(right, part.first_row, end, columns.len(), part.ntiles, max)
        });
    let resident = resident
        .map(|part| {
            let source = ListSource {
                right,
                columns,
                col_ids: col_ids.as_ref(),
                tile_rows: layout.tile_rows,
            };
            upload_part(device, program, part, Some(&source), stats)
        })
        .transpose()?;
    device
        .stream
        .synchronize()
        .map_err(cuda_err("uploading the right side"))?;
    let resident_bytes = col_bytes + resident.as_ref().map_or(0, |dev| dev.bytes);
    stats.peak_device_bytes = resident_bytes + scratch;
    record_process_stats(stats);
    Ok(Uploaded {
        resident: resident.map(|dev| vec![dev]),
        host_parts: None,
        col_ids,
        resident_bytes,
    })
}

impl GpuIndex {
    pub(crate) fn build_on<S: Semiring>(
        device: Arc<Device>,
        right: &SparseBatch,
        s: &S,
        options: &GpuOptions,
    ) -> Result<Self> {
        check_size(right)?;
        // Builds on one device take turns from here to the upload, so each one's budget is read
        // after the indexes built before it hold their memory: the driver's free memory is the
        // process's one ledger (the build holds every lane, so no probe's scratch is beside it;
        // probes on the lanes share what the budget leaves).
        let entered = std::time::Instant::now();
        let build_turn = device.take_all_lanes();
        let (free, _) = device.memory()?;
        let waited = entered.elapsed();
        // Leave room for the context and other users of the device when no limit is given.
        let budget = options.memory_limit.unwrap_or(free / 10 * 8);
        let started = std::time::Instant::now();
        let layout = Layout::of(&device, right, s, budget, options);
        let laid_out = started.elapsed();
        let started = std::time::Instant::now();
        let (exact, host_parts) = layout.prepare_with_exact(right, s);
        let prepared = started.elapsed();
        let parts = host_parts.len();
        let parts_meta = host_parts
            .iter()
            .map(|p| (p.first_row, p.rows, p.ntiles))
            .collect();
        let mut stats = GpuStats::default();
        let resident = (host_parts.len() == 1).then(|| &host_parts[0]);
        let mut uploaded = upload_layout(&device, &layout, right, resident, &mut stats)?;
        if host_parts.len() > 1 {
            uploaded.host_parts = Some(host_parts);
        } else {
            super::drop_later(host_parts);
        }
        drop(build_turn);
        log::debug!(
            "GPU index: {} rows, {parts} parts, the device's turn after {waited:?}, laid out in {laid_out:?}, prepared in {prepared:?}, uploaded in {:?} ({} bytes)",
            right.len(),
            started.elapsed() - prepared,
            stats.bytes_to_device
        );
        Ok(Self::assemble(
            device, right, layout, parts_meta, exact, uploaded, stats,
        ))
    }

    /// The whole right side on each of `devices` (prepared once, uploaded to all at once), or
    /// None when it would not stay resident on each of them (or their tiles differ): the caller
    /// then shards it instead.
    pub(crate) fn build_replicas<S: Semiring>(
        devices: &[Arc<Device>],
        right: &SparseBatch,
        s: &S,
        options: &GpuOptions,
    ) -> Result<Option<Vec<Self>>> {
        check_size(right)?;
        // Each device's turn, taken in ordinal order (two joins building at once must not wait
        // on each other's devices in opposite orders).
        let mut by_ordinal: Vec<&Arc<Device>> = devices.iter().collect();
        by_ordinal.sort_by_key(|d| d.ordinal);
        by_ordinal.dedup_by_key(|d| d.ordinal);
        let turns: Vec<_> = by_ordinal.iter().map(|d| d.take_all_lanes()).collect();
        let mut budget = u64::MAX;
        for d in devices {
            let (free, _) = d.memory()?;
            budget = budget.min(options.memory_limit.unwrap_or(free / 10 * 8));
        }
        let layout = Layout::of(&devices[0], right, s, budget, options);
        // (and the same tensor cores: the dense product is planned for the first device and
        // does not run below compute capability 8.0)
        let same_tiles = devices.iter().all(|d| {
            tile_rows(d, &layout.program) == layout.tile_rows
                && d.tensor_cores == devices[0].tensor_cores
        });
        if layout.ranges.len() != 1 || !same_tiles {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        let (exact, mut parts) = layout.prepare_with_exact(right, s);
        let part = parts
            .pop()
            .expect("a layout of one range prepares one part");
        let prepared = started.elapsed();
        let uploads: Vec<Result<(Uploaded, GpuStats)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = devices
                .iter()
                .map(|d| {
                    let (part, layout) = (&part, &layout);
                    scope.spawn(move || {
                        let mut stats = GpuStats::default();
                        let up = upload_layout(d, layout, right, Some(part), &mut stats)?;
                        Ok((up, stats))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(exec_datafusion_err!("GPU: an upload panicked")))
                })
                .collect()
        });
        drop(turns);
        log::debug!(
            "GPU index: {} rows on {} GPUs, prepared once in {prepared:?}, uploaded to all in {:?}",
            right.len(),
            devices.len(),
            started.elapsed() - prepared
        );
        let parts_meta = vec![(part.first_row, part.rows, part.ntiles)];
        let mut replicas = Vec::with_capacity(devices.len());
        for (d, up) in devices.iter().zip(uploads) {
            let (uploaded, stats) = up?;
            replicas.push(Self::assemble(
                Arc::clone(d),
                right,
                layout.clone(),
                parts_meta.clone(),
                exact.clone(),
                uploaded,
                stats,
            ));
        }
        Ok(Some(replicas))
    }

    fn assemble(
        device: Arc<Device>,
        right: &SparseBatch,
        layout: Layout,
        parts_meta: Vec<(usize, usize, usize)>,
        exact: Option<Arc<ExactRows>>,
        uploaded: Uploaded,
        stats: GpuStats,
    ) -> Self {
        GpuIndex {
            program: layout.program,
            device,
            rows: right.len(),
            columns: layout.columns,
            host_parts: uploaded.host_parts,
            parts_meta,
            tile_rows: layout.tile_rows,
            budget: layout.budget,
            dense_count: layout.dense.as_ref().map_or(0, |d| d.count),
            dense_row_bytes: layout.dense.as_ref().map_or(0, |d| {
                dense_bytes_per_left_row(
                    d.kp,
                    fast_kind(d.flags, d.kp),
                    right.len().div_ceil(DENSE_TILE_N) * DENSE_TILE_N,
                )
            }),
            max_row_len: right.max_row_len() as i32,
            exact,
            inner: Inner {
                resident: uploaded.resident,
                col_ids: uploaded.col_ids,
                resident_bytes: uploaded.resident_bytes,
                radius_pairs_per_row: AtomicU64::new(DEFAULT_RADIUS_PAIRS_PER_ROW),
            },
            stats: Mutex::new(stats),
        }
    }

    /// The CUDA ordinal of the GPU that holds this index.
    pub fn ordinal(&self) -> usize {
        self.device.ordinal
    }

    pub fn stats(&self) -> GpuStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the right side multiplied as a dense block on the tensor cores (0: none; see
    /// the `dense_columns` option).
    pub fn dense_columns(&self) -> usize {
        self.dense_count
    }

    /// Parts the right side is cut into (1 when it stays on the device between probes).
    pub fn parts(&self) -> usize {
        self.parts_meta.len()
    }

    pub fn probe(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
    ) -> Result<PairList> {
        self.probe_counted(left, selection, options, &Cancel::new())
            .map(|(pairs, _)| pairs)
    }

    /// Host bytes the index keeps (the parts' host copies when they are streamed).
    pub(crate) fn host_bytes(&self) -> usize {
        let parts = self.host_parts.as_ref().map_or(0, |parts| {
            parts.iter().map(|p| p.device_bytes() as usize).sum()
        });
        parts + self.exact.as_ref().map_or(0, |e| e.memory_size())
    }

    /// [`GpuIndex::probe`], with this probe's own counters; gives up between launches once
    /// `cancel` is set.
    pub fn probe_counted(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<(PairList, GpuStats)> {
        if selection == Selection::Nearest(0) || left.is_empty() || self.rows == 0 {
            return Ok((PairList::default(), GpuStats::default()));
        }
        let mut probe_stats = GpuStats::default();
        let result = match selection {
            // Takes the device between its host steps (other probes' kernels run meanwhile).
            _ if self.exact.is_some() => {
                self.probe_certified_in_steps(left, selection, options, cancel, &mut probe_stats)
            }
            Selection::Nearest(k) if k > MAX_DEVICE_K => self.with_device(|inner, lanes| {
                self.probe_large_k(inner, lanes, left, k, options, cancel, &mut probe_stats)
            }),
            _ => self.with_device(|inner, lanes| {
                self.probe_locked(
                    inner,
                    lanes,
                    left,
                    selection,
                    options,
                    cancel,
                    &mut probe_stats,
                    Bounds::NONE,
                )
            }),
        };
        let mut stats = self
            .stats
            .lock()
            .map_err(|_| exec_datafusion_err!("GPU: a probe panicked"))?;
        stats.bytes_to_device += probe_stats.bytes_to_device;
        stats.kernel_nanos += probe_stats.kernel_nanos;
        stats.peak_device_bytes = stats.peak_device_bytes.max(probe_stats.peak_device_bytes);
        drop(stats);
        record_process_stats(&probe_stats);
        result.map(|pairs| (pairs, probe_stats))
    }

    /// Runs `f` on a lane of this index's device (see [`Device::take_lane`]; every lane when the
    /// right side's parts are streamed, which then run alone), with the context bound to this
    /// thread.
    fn with_device<R>(&self, f: impl FnOnce(&Inner, &Lanes<'_>) -> Result<R>) -> Result<R> {
        let lanes = match self.inner.resident {
            Some(_) => self.device.take_lane(),
            None => self.device.take_all_lanes(),
        };
        lanes
            .device()
            .ctx
            .bind_to_thread()
            .map_err(cuda_err("binding the CUDA context"))?;
        f(&self.inner, &lanes)
    }

    #[allow(clippy::too_many_arguments)]
    fn probe_locked(
        &self,
        inner: &Inner,
        lanes: &Lanes<'_>,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        stats: &mut GpuStats,
        bounds: Bounds<'_>,
    ) -> Result<PairList> {
        let device = lanes.device();
        // Probes on the other lanes may hold scratch as large as this one's.
        let sharing = lanes.sharing_budget();
        let mut per_part = Vec::with_capacity(self.parts_meta.len());
        for p in 0..self.parts_meta.len() {
            // A streamed part lives on the device for this probe only.
            let streamed;
            let (part, part_bytes): (&DevPart, u64) = match &inner.resident {
                Some(parts) => (&parts[p], 0),
                None => {
                    let host = &self
                        .host_parts
                        .as_ref()
                        .expect("host parts when not resident")[p];
                    streamed = upload_part(device, &self.program, host, None, stats)?;
                    let b = streamed.bytes;
                    (&streamed, b)
                }
            };
            let held = inner.resident_bytes + part_bytes;
            let budget = held + self.budget.saturating_sub(held) / sharing;
            let (first_row, part_rows, ntiles) = self.parts_meta[p];
            let launch = PartLaunch {
                device,
                program: &self.program,
                columns: &self.columns,
                part,
                col_ids: inner.col_ids.as_ref(),
                first_row,
                part_rows,
                ntiles,
                tile_rows: self.tile_rows,
                budget,
                held,
                lower_bounds: bounds.lower,
                max_row_len: self.max_row_len,
                shared_only: bounds.shared_only,
                row_radius: bounds.row_radius,
                active_rows: bounds.active_rows,
                radius_pairs_per_row: &inner.radius_pairs_per_row,
            };
            let mut out = PairList::default();
            let work_budget = budget.saturating_sub(held).max(1);
            let mut r0 = 0;
            // Shrinks when a radius chunk finds more pairs than the budget can hold.
            let mut max_rows = usize::MAX;
            while r0 < left.len() {
                cancel.check()?;
                // (saturating: `max_rows` starts unbounded, and a wrapped sum would send the
                // chunk backwards, relaunching the first one forever)
                let r1 = self
                    .chunk_end(left, r0, selection, work_budget)
                    .min(r0.saturating_add(max_rows));
                let ran = match launch.run(left, r0, r1, selection, options, stats) {
                    // Another operator's index took the memory this chunk's estimate counted on:
                    // shrink the chunk and retry, as when the estimate itself is over budget.
                    Err(e) if is_out_of_memory(&e) && r1 - r0 > 1 => None,
                    other => other?,
                };
                match ran {
                    Some(chunk) => {
                        out.append(chunk);
                        cancel.add_rows(r1 - r0);
                        r0 = r1;
                    }
                    None => max_rows = ((r1 - r0) / 2).max(1),
                }
            }
            per_part.push(out);
        }
        device
            .stream
            .synchronize()
            .map_err(cuda_err("finishing a probe"))?;
        Ok(match selection {
            Selection::Nearest(k) => merge_nearest(per_part, k, self.program.similarity),
            // A certified metric's candidates (millions a probe, their lower bounds left on the
            // device: `distance` is empty): `probe_certified` groups them by left row itself and
            // needs no order within a row.
            Selection::Within(_) if bounds.lower => {
                let mut all = PairList::default();
                for part in per_part {
                    all.append(part);
                }
                all
            }
            Selection::Within(_) => merge_within(per_part),
        })
    }

    /// A sum with an exact union term (minkowski, hellinger, jensenshannon) or a max over the
    /// union (chebyshev), exactly: a folded sum cancels for large, nearly equal values, and a max
    /// read from the inverted lists knows only which of each row's 32 largest entries are shared,
    /// so the kernels return bounds instead (the folded sum shifted by its proven rounding error;
    /// a max's are exact unless a row's 32 largest are all shared or a shared difference is not
    /// a float: it is rounded down to one). Candidates are computed exactly over the union on the
    /// host and selected there.
    ///
    /// k nearest: a first pass keeps each left row's `wide` rows of smallest (lower bound, row);
    /// computed exactly, they give a k-th answer (D, row); when that comes before the last row
    /// kept, no row left out can enter and the left row is done. Only the other rows run the
    /// candidate pass: every right row whose lower bound is within D. A radius: the candidate
    /// pass within the radius. Where the metric allows it ([`ExactRows::finds_disjoint_rows`]),
    /// the kernels leave out the pairs that share no column: the host finds a left row's nearest
    /// such rows exactly from the rows' one-sided sums (such rows tie in large groups that any
    /// bound of nonzero width would admit whole).
    fn probe_certified(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        stats: &mut GpuStats,
    ) -> Result<PairList> {
        let exact = self
            .exact
            .as_ref()
            .expect("certified metrics keep the exact distance")
            .clone();
        let started = std::time::Instant::now();
        let shared_only = exact.finds_disjoint_rows();
        // Each left row's answer so far: its nearest rows (or rows within the radius) among
        // those sharing no column.
        let mut rows: Vec<Vec<(f64, u32)>> = (0..left.len())
            .into_par_iter()
            .map(|l| {
                if !shared_only || left.is_null(l) {
                    return Vec::new();
                }
                let x = sorted_nonzeros(left.row(l));
                let skip = options.excluded_right_row(l, self.rows);
                exact.disjoint_rows(&x, exact.left_one_sided(&x), selection, skip)
            })
            .collect();
        let disjoint_done = started.elapsed().as_secs_f64();
        let kth = |row: &[(f64, u32)], k: usize| match row.len() {
            n if n == k && k > 0 => row[k - 1].0,
            _ => f64::INFINITY,
        };
        // Each row's radius for the candidate pass (the k-th distance of rows found so far, or
        // an upper bound on the k-th), and the rows that still need it.
        let mut first_pairs = 0;
        let (row_radius, active_rows): (Option<Vec<f64>>, Option<Vec<bool>>) = match selection {
            Selection::Nearest(k) if k <= MAX_DEVICE_K => {
                let wide = (2 * k).max(k + 16).min(MAX_DEVICE_K);
                let lower = self.with_device(|inner, lanes| {
                    self.probe_locked(
                        inner,
                        lanes,
                        left,
                        Selection::Nearest(wide),
                        options,
                        cancel,
                        stats,
                        Bounds {
                            lower: true,
                            row_radius: None,
                            shared_only,
                            active_rows: None,
                        },
                    )
                })?;
                first_pairs = lower.len();
                let starts = left_row_starts(&lower.left, left.len());
                let (radius, open): (Vec<f64>, Vec<bool>) = rows
                    .par_iter_mut()
                    .enumerate()
                    .map(|(l, row)| {
                        let range = starts[l]..starts[l + 1];
                        add_exact(&exact, left, l, &lower.right[range.clone()], row);
                        keep_answer(row, selection);
                        let answer_k = (row.len() == k).then(|| row[k - 1]);
                        // Rows left out come after the last one kept in (lower bound, row)
                        // order, so after the k-th answer when that one is before it: then none
                        // can enter (ties included, where bounds are exact: a max's mostly are).
                        let last = range
                            .clone()
                            .map(|i| (lower.distance[i], lower.right[i]))
                            .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                        let done = range.len() < wide
                            || matches!((answer_k, last), (Some(a), Some(last))
                                if a.0.total_cmp(&last.0).then(a.1.cmp(&last.1)).is_lt());
                        (answer_k.map_or(f64::INFINITY, |a| a.0), !done)
                    })
                    .unzip();
                if !open.contains(&true) {
                    let timing = [disjoint_done, started.elapsed().as_secs_f64()];
                    log_certified(left.len(), lower.len(), (0, 0), &rows, started, timing);
                    return Ok(into_pairs(rows));
                }
                (Some(radius), Some(open))
            }
            Selection::Nearest(k) if shared_only => {
                (Some(rows.iter().map(|row| kth(row, k)).collect()), None)
            }
            Selection::Nearest(_) | Selection::Within(_) => (None, None),
        };
        let within = match selection {
            Selection::Nearest(_) => f64::INFINITY,
            Selection::Within(radius) => radius,
        };
        let first_done = started.elapsed().as_secs_f64();
        let candidates = self.with_device(|inner, lanes| {
            self.probe_locked(
                inner,
                lanes,
                left,
                Selection::Within(within),
                options,
                cancel,
                stats,
                Bounds {
                    lower: true,
                    row_radius: row_radius.as_deref(),
                    shared_only,
                    active_rows: active_rows.as_deref(),
                },
            )
        })?;
        cancel.check()?;
        // Candidates come in no order: grouped by left row with a counting sort.
        let starts = left_row_starts(&candidates.left, left.len());
        let mut fill = starts.clone();
        let mut by_left = vec![0u32; candidates.len()];
        for (&l, &j) in candidates.left.iter().zip(&candidates.right) {
            by_left[fill[l as usize]] = j;
            fill[l as usize] += 1;
        }
        let found = candidates.len();
        drop(candidates);
        rows.par_iter_mut().enumerate().for_each(|(l, row)| {
            add_exact(&exact, left, l, &by_left[starts[l]..starts[l + 1]], row);
            keep_answer(row, selection);
        });
        let second_rows = active_rows.map_or(left.len(), |a| a.iter().filter(|&&o| o).count());
        let timing = [disjoint_done, first_done];
        log_certified(
            left.len(),
            first_pairs,
            (second_rows, found),
            &rows,
            started,
            timing,
        );
        Ok(into_pairs(rows))
    }

    /// Left rows whose pairs with every right row may be held at once.
    fn rows_per_step_of_every_pair(&self) -> usize {
        (self.budget / 4 / (self.rows.max(1) as u64 * 16)).clamp(1, 4096) as usize
    }

    /// [`GpuIndex::probe_certified`]; a k above the kernels' whose radius nothing bounds (no
    /// disjoint rows found on the host: chebyshev) makes every pair a candidate, so the left rows
    /// go a few at a time, as in [`GpuIndex::probe_large_k`].
    fn probe_certified_in_steps(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        stats: &mut GpuStats,
    ) -> Result<PairList> {
        let unbounded = matches!(selection, Selection::Nearest(k) if k > MAX_DEVICE_K)
            && !self.exact.as_ref().is_some_and(|e| e.finds_disjoint_rows());
        let step = self.rows_per_step_of_every_pair();
        if !unbounded || left.len() <= step {
            return self.probe_certified(left, selection, options, cancel, stats);
        }
        let mut out = PairList::default();
        for r0 in (0..left.len()).step_by(step) {
            let rows = step.min(left.len() - r0);
            let part = self.probe_certified(
                &left.slice(r0, rows),
                selection,
                options.shifted(r0),
                cancel,
                stats,
            )?;
            for i in 0..part.len() {
                out.push(part.left[i] + r0 as u32, part.right[i], part.distance[i]);
            }
        }
        Ok(out)
    }

    /// The end of the left chunk that starts at `r0`: its upload and outputs fit `budget`.
    fn chunk_end(&self, left: &SparseBatch, r0: usize, selection: Selection, budget: u64) -> usize {
        let out_per_row = match selection {
            Selection::Nearest(k) => k as u64 * 8 + 8,
            Selection::Within(_) => 64,
        };
        let off = left.offsets();
        let mut r1 = r0;
        let mut bytes = 0u64;
        let step = 256;
        // The dense product's output is a float per pair: at most DENSE_LAUNCH_BYTES a launch
        // (fewer, larger allocations cost more than they save).
        let max_rows = DENSE_LAUNCH_BYTES
            .checked_div(self.dense_row_bytes)
            .map_or(MAX_CHUNK_ROWS, |rows| (rows as usize).max(256));
        while r1 < left.len() && r1 - r0 < max_rows {
            let next = (r1 + step).min(left.len());
            let entries = (off[next] - off[r1]) as u64;
            // Entries go up twice for chebyshev (the raw slices and the sorted copy).
            let add = entries * 16 + (next - r1) as u64 * (out_per_row + 12 + self.dense_row_bytes);
            if bytes + add > budget / 2 && r1 > r0 {
                break;
            }
            bytes += add;
            r1 = next;
        }
        r1
    }

    /// k above what the kernels select: every pair's distance is computed on the device (the
    /// radius kernels with an unbounded radius, in chunks the budget holds) and the k nearest of
    /// each left row are kept on the host, ties to the earlier right row as everywhere.
    #[allow(clippy::too_many_arguments)]
    fn probe_large_k(
        &self,
        inner: &Inner,
        lanes: &Lanes<'_>,
        left: &SparseBatch,
        k: usize,
        options: ProbeOptions,
        cancel: &Cancel,
        stats: &mut GpuStats,
    ) -> Result<PairList> {
        let everything = if self.program.similarity {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
        let mut out = PairList::default();
        let mut topk = TopK::default();
        let rows_per_step = self.rows_per_step_of_every_pair();
        let mut r0 = 0;
        while r0 < left.len() {
            let r1 = (r0 + rows_per_step).min(left.len());
            let all = self.probe_locked(
                inner,
                lanes,
                &left.slice(r0, r1 - r0),
                Selection::Within(everything),
                options.shifted(r0),
                cancel,
                stats,
                Bounds::NONE,
            )?;
            let mut i = 0;
            while i < all.len() {
                let lrow = all.left[i];
                topk.reset(k);
                // Pairs come ordered by right row, so an equal distance keeps the earlier row.
                while i < all.len() && all.left[i] == lrow {
                    let d = all.distance[i];
                    topk.push(if self.program.similarity { -d } else { d }, all.right[i]);
                    i += 1;
                }
                for (key, j) in topk.drain_sorted() {
                    let d = if self.program.similarity { -key } else { key };
                    out.push(r0 as u32 + lrow, j, d);
                }
            }
            r0 = r1;
        }
        Ok(out)
    }
}
