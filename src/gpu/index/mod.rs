//! The right side of a join on the GPU, and probing it with left batches.
//!
//! The right side is prepared once (see `prepare`): an inverted index (CSC: column → (row,
//! value) list, row-sorted when the host builds it; built on the device from the rows when the
//! right side stays whole there, see `lists`), the split point of every column at every tile
//! boundary, the per-row totals and a validity bitmask (for a max, also each entry's rank in its
//! row and each row's largest values); certified metrics also keep the rows on the host for
//! their exact step (`join::ExactRows`). It stays on the device while left batches stream
//! through; a left batch goes up as the Arrow buffers' own slices (the list offsets are the CSR
//! row pointer). When the right side does not fit the memory budget it is cut into parts by rows
//! that are uploaded one at a time per probe, and the parts' results are merged by the join core.
//!
//! - this file: the index value (build, replicas, accessors, the device's lanes);
//! - `layout.rs`: the build's layout, the parts prepared on the host, their upload;
//! - `probe.rs`: a probe cut into launches, run over the parts, merged;
//! - `certified.rs`: the certified metrics' bounds, exact step and candidate pass;
//! - `large_k.rs`: a k above the kernels' top-k, selected on the host;
//! - `mask.rs`: a filter's predicate over kept columns, run in a kernel;
//! - `matrix.rs`: the distance matrix of the folded metrics, a block of float64 on the device.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;
use datafusion::common::{exec_datafusion_err, DataFusionError, Result};

use super::device::{cuda_err, Device, Lanes};
use super::kernels::MetricProgram;
use super::launch::DEFAULT_RADIUS_PAIRS_PER_ROW;
use super::lists;
use super::memory::{addr, upload};
use super::prepare::{
    dense_bytes_per_left_row, fast_kind, ColumnMap, ColumnProfile, DevPart, HostPart, DENSE_TILE_N,
};
use super::stats::{record_process_stats, GpuOptions, GpuStats};
use crate::join::{Cancel, ExactRows, PairList, ProbeOptions, RowMask, Selection, NO_GROUP};
use crate::metric::Semiring;
use crate::vector::SparseBatch;

mod certified;
mod coalesce;
mod exact;
mod large_k;
mod layout;
mod mask;
mod matrix;
mod probe;

use certified::Bounds;
use layout::{check_size, tile_rows, upload_layout, Layout, Uploaded};

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
    /// The same rows on the device, where the exact step runs there (see `exact`).
    exact_rows: Option<exact::DevRows>,
    /// Read by probes at once, each on a lane of the device.
    inner: Inner,
    stats: Mutex<GpuStats>,
    /// Lookups waiting for a lane, launched together (`coalesce.rs`).
    coalescer: coalesce::Coalescer,
    /// Kept columns a filter's program read, uploaded by the first (`mask.rs`), by column.
    mask_columns: Mutex<mask::MaskColumns>,
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

impl GpuIndex {
    /// `profile`: the right side's column profile when known (an index file keeps it).
    pub(crate) fn build_on<S: Semiring>(
        device: Arc<Device>,
        right: &SparseBatch,
        s: &S,
        options: &GpuOptions,
        profile: Option<&ColumnProfile>,
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
        let layout = Layout::of(&device, right, s, budget, options, profile);
        let laid_out = started.elapsed();
        let started = std::time::Instant::now();
        let mut stats = GpuStats::default();
        // A right side that stays whole with its lists built on the device sends its rows up
        // while the host prepares the rest: the copy and that work take about as long.
        let (rows_up, (exact, host_parts)) = std::thread::scope(|scope| {
            let sending = layout.lists_on_device.then(|| {
                let device = &device;
                scope.spawn(move || {
                    let mut stats = GpuStats::default();
                    device
                        .ctx
                        .bind_to_thread()
                        .map_err(cuda_err("binding the CUDA context"))?;
                    let rows = lists::upload_rows(device, right, 0, right.len(), &mut stats)?;
                    Ok::<_, DataFusionError>((rows, stats))
                })
            });
            let prepared = layout.prepare_with_exact(right, s);
            let sent = sending.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            (sent.transpose(), prepared)
        });
        let rows_up = rows_up?.map(|(rows, sent)| {
            stats.bytes_to_device += sent.bytes_to_device;
            rows
        });
        let prepared = started.elapsed();
        let parts = host_parts.len();
        let parts_meta = host_parts
            .iter()
            .map(|p| (p.first_row, p.rows, p.ntiles))
            .collect();
        let resident = (host_parts.len() == 1).then(|| &host_parts[0]);
        let mut uploaded = upload_layout(
            &device,
            &layout,
            right,
            resident,
            rows_up.as_ref(),
            &mut stats,
        )?;
        drop(rows_up);
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
        let mut index = Self::assemble(device, right, layout, parts_meta, exact, uploaded, stats);
        index.upload_exact_rows()?;
        Ok(index)
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
        let layout = Layout::of(&devices[0], right, s, budget, options, None);
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
                        let up = upload_layout(d, layout, right, Some(part), None, &mut stats)?;
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
            let mut replica = Self::assemble(
                Arc::clone(d),
                right,
                layout.clone(),
                parts_meta.clone(),
                exact.clone(),
                uploaded,
                stats,
            );
            replica.upload_exact_rows()?;
            replicas.push(replica);
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
            exact_rows: None,
            inner: Inner {
                resident: uploaded.resident,
                col_ids: uploaded.col_ids,
                resident_bytes: uploaded.resident_bytes,
                radius_pairs_per_row: AtomicU64::new(DEFAULT_RADIUS_PAIRS_PER_ROW),
            },
            stats: Mutex::new(stats),
            coalescer: Default::default(),
            mask_columns: Default::default(),
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

    /// Whether a certified metric's exact step runs on the device (its rows fit there beside a
    /// right side that stays whole; see `exact`); false for the other metrics.
    pub fn exact_on_device(&self) -> bool {
        self.exact_rows.is_some()
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
        if self.coalesces(left, selection, options) {
            return self.probe_coalesced(left, selection, cancel);
        }
        self.probe_counted_masked(left, selection, options, cancel, None, None)
    }

    /// Launches that carried the probes of several callers at once (lookups that arrived while
    /// every lane of the device was taken), and how many probes they carried in all.
    pub fn launches_together(&self) -> (u64, u64) {
        self.coalescer.together()
    }

    /// Whether a probe for `selection` can skip a mask's failing rows in the kernels (their
    /// valid bits cleared): the folded metrics' probes of k up to [`MAX_DEVICE_K`] or within a
    /// radius. The certified metrics' exact step and a larger k run on the host's candidates.
    pub(crate) fn masks_on_device(&self, selection: Selection) -> bool {
        self.exact.is_none() && !matches!(selection, Selection::Nearest(k) if k > MAX_DEVICE_K)
    }

    /// [`GpuIndex::probe_counted`] offering only the rows `mask` passes (where
    /// [`GpuIndex::masks_on_device`]; otherwise the mask is not read).
    pub(crate) fn probe_counted_masked(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        mask: Option<&RowMask>,
        groups: Option<(&[u32], &[u32])>,
    ) -> Result<(PairList, GpuStats)> {
        if groups.is_some() && !self.masks_on_device(selection) {
            return Err(exec_datafusion_err!(
                "GPU: a grouped probe of {selection:?} cannot run in the kernels"
            ));
        }
        let mask = mask.filter(|_| self.masks_on_device(selection));
        if mask.is_some_and(|m| m.passing() == 0) {
            return Ok((PairList::default(), GpuStats::default()));
        }
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
                // within=COLUMN: both sides' groups on the device for the probe; a left row of
                // no group is not computed.
                let device = lanes.device();
                let on_device = match groups {
                    Some((l, r)) => Some((
                        upload(device, l, &mut probe_stats)?,
                        upload(device, r, &mut probe_stats)?,
                    )),
                    None => None,
                };
                let active: Option<Vec<bool>> =
                    groups.map(|(l, _)| l.iter().map(|&g| g != NO_GROUP).collect());
                self.probe_locked(
                    inner,
                    lanes,
                    left,
                    selection,
                    options,
                    cancel,
                    &mut probe_stats,
                    Bounds {
                        mask,
                        active_rows: active.as_deref(),
                        groups: on_device
                            .as_ref()
                            .map(|(l, r)| (addr(device, l), addr(device, r))),
                        ..Bounds::NONE
                    },
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
        stats.most_tile_groups = stats.most_tile_groups.max(probe_stats.most_tile_groups);
        drop(stats);
        record_process_stats(&probe_stats);
        result.map(|pairs| (pairs, probe_stats))
    }

    /// Runs `f` on a lane of this index's device (see [`Device::take_lane`]; every lane when the
    /// right side's parts are streamed, which then run alone), with the context bound to this
    /// thread.
    fn with_device<R>(&self, f: impl FnOnce(&Inner, &Lanes<'_>) -> Result<R>) -> Result<R> {
        let asked = std::time::Instant::now();
        let lanes = match self.inner.resident {
            Some(_) => self.device.take_lane(),
            None => self.device.take_all_lanes(),
        };
        lanes
            .device()
            .ctx
            .bind_to_thread()
            .map_err(cuda_err("binding the CUDA context"))?;
        let bound = asked.elapsed();
        let answer = f(&self.inner, &lanes);
        log::debug!(
            "GPU {}: a lane after {bound:?}, held {:?}",
            self.device.ordinal,
            asked.elapsed() - bound
        );
        answer
    }
}
