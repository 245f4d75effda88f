//! The right side of a join on the GPU, and probing it with left batches.
//!
//! The right side is prepared once: for the folded metrics an inverted index (CSC: column →
//! row-sorted (row, value) list), the split point of every column at every tile boundary, the
//! per-row totals and a validity bitmask; for chebyshev the rows themselves (CSR, column-sorted).
//! It stays on the device while left batches stream through; a left batch goes up as the Arrow
//! buffers' own slices (the list offsets are the CSR row pointer). When the right side does not
//! fit the memory budget it is cut into parts by rows that are uploaded one at a time per probe,
//! and the parts' top-k lists are merged on the host.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use datafusion::common::{exec_datafusion_err, exec_err, Result};
use rayon::prelude::*;

use super::device::{cuda_err, Device};
use super::kernels::{self, CHEBYSHEV_THREADS, FOLDED_THREADS};
use super::{record_process_stats, GpuOptions, GpuStats};
use crate::cpu::{self, CpuIndex, PairList, ProbeOptions, Selection};
use crate::metric::{with_semiring, Metric, MetricKind, RowTotals, Semiring};
use crate::vector::SparseBatch;

/// The largest k selected on the device; larger k goes to the CPU backend (see `probe`).
pub(crate) const MAX_DEVICE_K: usize = 1024;
/// `self_first` when exclude_self is off (the kernels' NO_SELF).
const NO_SELF: i64 = i64::MIN;
/// Left rows per launch, at most (bounded further by the memory budget).
const MAX_CHUNK_ROWS: usize = 1 << 18;

/// Maps a column index to a column id of the right side.
#[derive(Debug)]
enum ColumnMap {
    /// Ids are the indices themselves, below `len`.
    Direct(usize),
    /// The right side's distinct indices, sorted (hashed n-grams up to 2^31).
    Sorted(Vec<i32>),
}

impl ColumnMap {
    fn get(&self, c: i32) -> Option<u32> {
        match self {
            ColumnMap::Direct(len) => (c >= 0 && (c as usize) < *len).then_some(c as u32),
            ColumnMap::Sorted(ids) => ids.binary_search(&c).ok().map(|i| i as u32),
        }
    }

    fn len(&self) -> usize {
        match self {
            ColumnMap::Direct(len) => *len,
            ColumnMap::Sorted(ids) => ids.len(),
        }
    }
}

/// One part of the right side (rows `first_row..first_row + rows`), prepared on the host.
#[derive(Debug, Default)]
struct HostPart {
    first_row: usize,
    rows: usize,
    valid_bits: Vec<u32>,
    /// Folded metrics: totals as f32 or f64 bytes (the kernel's accumulator type).
    rt0: Vec<u8>,
    rt1: Vec<u8>,
    ntiles: usize,
    tile_ptr: Vec<u32>,
    col_rows: Vec<u32>,
    col_vals: Vec<f32>,
    /// Chebyshev: column-sorted CSR with column ids.
    r_ptr: Vec<u32>,
    r_col: Vec<i32>,
    r_val: Vec<f32>,
}

impl HostPart {
    fn device_bytes(&self) -> u64 {
        (self.valid_bits.len() * 4
            + self.rt0.len()
            + self.rt1.len()
            + self.tile_ptr.len() * 4
            + self.col_rows.len() * 4
            + self.col_vals.len() * 4
            + self.r_ptr.len() * 4
            + self.r_col.len() * 4
            + self.r_val.len() * 4) as u64
    }
}

/// A part's buffers on the device.
struct DevPart {
    valid_bits: CudaSlice<u32>,
    rt0: CudaSlice<u8>,
    rt1: CudaSlice<u8>,
    tile_ptr: CudaSlice<u32>,
    col_rows: CudaSlice<u32>,
    col_vals: CudaSlice<f32>,
    r_ptr: CudaSlice<u32>,
    r_col: CudaSlice<i32>,
    r_val: CudaSlice<f32>,
    bytes: u64,
}

/// Mutable state of an index: resident buffers and counters, behind one lock (probes of one
/// index are serialised; they also take the device's lock).
struct Inner {
    resident: Option<Vec<DevPart>>,
    col_ids: Option<CudaSlice<i32>>,
    stats: GpuStats,
    /// Device bytes held by this index between probes.
    resident_bytes: u64,
}

/// The right side of a join, resident on the device (or streamed in parts).
pub struct GpuIndex {
    metric: Metric,
    device: Arc<Device>,
    rows: usize,
    columns: ColumnMap,
    /// Host copies of the parts; kept only when the parts do not all stay on the device.
    host_parts: Option<Vec<HostPart>>,
    parts_meta: Vec<(usize, usize, usize)>, // (first_row, rows, ntiles)
    tile_rows: usize,
    budget: u64,
    inner: Mutex<Inner>,
    /// For k above MAX_DEVICE_K: the right batch (shares the Arrow buffers) and a CPU index.
    right: SparseBatch,
    cpu: OnceLock<CpuIndex>,
}

impl std::fmt::Debug for GpuIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuIndex")
            .field("device", &self.device)
            .field("metric", &self.metric)
            .field("rows", &self.rows)
            .field("parts", &self.parts_meta.len())
            .field("tile_rows", &self.tile_rows)
            .finish()
    }
}

fn is_cheb(metric: &Metric) -> bool {
    metric.kind == MetricKind::Chebyshev
}

/// Accumulator bytes per right row of a tile.
fn acc_bytes(kind: MetricKind) -> usize {
    let one = if kernels::accumulates_in_f64(kind) {
        8
    } else {
        4
    };
    one * if kernels::two_accumulators(kind) {
        2
    } else {
        1
    }
}

/// Candidate-buffer entries for a top-k of `k`: room for k plus one round of the block.
fn cap_for(k: usize, threads: u32) -> usize {
    (k + threads as usize).next_power_of_two()
}

/// Bytes of shared memory the folded kernels use beside the accumulators.
fn folded_fixed_smem(k: usize) -> usize {
    cap_for(k, FOLDED_THREADS) * 8 + FOLDED_THREADS as usize * 12
}

fn upload<T: DeviceRepr>(
    device: &Device,
    data: &[T],
    stats: &mut GpuStats,
) -> Result<CudaSlice<T>> {
    stats.bytes_to_device += std::mem::size_of_val(data) as u64;
    if data.is_empty() {
        // A zero-byte allocation is an error in the driver: keep one (never read) element.
        // SAFETY: the element is never read by a kernel (lengths say the buffer is empty).
        return unsafe { device.stream.alloc::<T>(1) }
            .map_err(cuda_err("allocating device memory"));
    }
    device
        .stream
        .clone_htod(data)
        .map_err(cuda_err("copying to the device"))
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(device: &Device, n: usize) -> Result<CudaSlice<T>> {
    device
        .stream
        .alloc_zeros::<T>(n.max(1))
        .map_err(cuda_err("allocating device memory"))
}

fn download<T: DeviceRepr>(device: &Device, src: &CudaSlice<T>, n: usize) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut v = device
        .stream
        .clone_dtoh(&src.slice(0..n))
        .map_err(cuda_err("copying from the device"))?;
    v.truncate(n);
    Ok(v)
}

impl GpuIndex {
    pub(crate) fn build_on(
        device: Arc<Device>,
        right: &SparseBatch,
        metric: &Metric,
        options: &GpuOptions,
    ) -> Result<Self> {
        let rows = right.len();
        if rows >= u32::MAX as usize || right.nnz() >= u32::MAX as usize {
            return exec_err!(
                "GPU: the right side is too large ({rows} rows, {} entries); use device=cpu",
                right.nnz()
            );
        }
        let (free, _) = device.memory()?;
        // Leave room for the context and other users of the device when no limit is given.
        let budget = options.memory_limit.unwrap_or(free / 10 * 8);

        // Column ids: the indices themselves when the index space is not much larger than the
        // data, else the sorted distinct indices (found by binary search on the device).
        let nnz_nonzero = right.values().iter().filter(|v| **v != 0.0).count();
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

        let tile_rows = if is_cheb(metric) {
            0
        } else {
            // Four blocks per SM: measured on an H200 (full self-joins, k=10), a quarter of the
            // SM's shared memory per block (8,448 float rows per tile) beat half of it (23,232
            // rows) by 1.5x on scrna and 1.25x on movielens: more warps in flight hide the
            // latency of the inverted lists and the shared-memory atomics.
            let per_block = (device.smem_optin as usize)
                .min((device.smem_per_sm as usize / 4).saturating_sub(1024));
            let avail = per_block.saturating_sub(folded_fixed_smem(MAX_DEVICE_K) + 256);
            let mut t = (avail / acc_bytes(metric.kind)) / 32 * 32;
            if let Some(forced) = std::env::var("SPARSE_KNN_GPU_TILE_ROWS")
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
            {
                // Testing knob: small tiles exercise the tile boundaries on small inputs.
                t = t.min(forced.max(32) / 32 * 32);
            }
            t.max(32)
        };

        // Parts: one when the prepared right side fits in 60% of the budget (the rest is for
        // probes); otherwise parts of at most 30% each, streamed per probe.
        let total_estimate = estimate_bytes(right, 0, rows, metric, &columns, tile_rows);
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
                let per_row = 4 + acc_bytes(metric.kind) as u64 * 2;
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
        let started = std::time::Instant::now();
        let host_parts: Vec<HostPart> = ranges
            .par_iter()
            .map(|&(s, e)| prepare_part(right, s, e, metric, &columns, tile_rows))
            .collect();
        let parts_meta_len = host_parts.len();
        let parts_meta = host_parts
            .iter()
            .map(|p| (p.first_row, p.rows, p.ntiles))
            .collect();

        let mut stats = GpuStats::default();
        let _guard = device
            .lock
            .lock()
            .map_err(|_| exec_datafusion_err!("GPU: a probe panicked"))?;
        device
            .ctx
            .bind_to_thread()
            .map_err(cuda_err("binding the CUDA context"))?;
        let col_ids = match &columns {
            ColumnMap::Sorted(ids) => Some(upload(&device, ids, &mut stats)?),
            ColumnMap::Direct(_) => None,
        };
        let col_bytes = match &columns {
            ColumnMap::Sorted(ids) => ids.len() as u64 * 4,
            ColumnMap::Direct(_) => 0,
        };
        let (resident, host_parts, resident_bytes) = if host_parts.len() == 1 {
            let dev = upload_part(&device, &host_parts[0], &mut stats)?;
            let bytes = dev.bytes;
            (Some(vec![dev]), None, bytes + col_bytes)
        } else {
            (None, Some(host_parts), col_bytes)
        };
        device
            .stream
            .synchronize()
            .map_err(cuda_err("uploading the right side"))?;
        stats.peak_device_bytes = resident_bytes;
        record_process_stats(&stats);
        log::debug!(
            "GPU index: {rows} rows, {} parts, prepared and uploaded in {:?} ({} bytes)",
            parts_meta_len,
            started.elapsed(),
            stats.bytes_to_device
        );
        drop(_guard);
        Ok(GpuIndex {
            metric: *metric,
            device,
            rows,
            columns,
            host_parts,
            parts_meta,
            tile_rows,
            budget,
            inner: Mutex::new(Inner {
                resident,
                col_ids,
                stats,
                resident_bytes,
            }),
            right: right.clone(),
            cpu: OnceLock::new(),
        })
    }

    pub fn stats(&self) -> GpuStats {
        self.inner
            .lock()
            .map(|i| i.stats.clone())
            .unwrap_or_default()
    }

    pub fn rows(&self) -> usize {
        self.rows
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
        if let Selection::Nearest(k) = selection {
            if k == 0 {
                return Ok(PairList::default());
            }
            if k > MAX_DEVICE_K {
                // The device top-k keeps its candidates in shared memory; beyond this k the
                // CPU backend answers (same results and order).
                let index = self
                    .cpu
                    .get_or_init(|| CpuIndex::build(&self.right, &self.metric));
                return Ok(cpu::probe(index, left, selection, options));
            }
        }
        if left.is_empty() || self.rows == 0 {
            return Ok(PairList::default());
        }
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| exec_datafusion_err!("GPU: a probe panicked"))?;
        let _guard = self
            .device
            .lock
            .lock()
            .map_err(|_| exec_datafusion_err!("GPU: a probe panicked"))?;
        self.device
            .ctx
            .bind_to_thread()
            .map_err(cuda_err("binding the CUDA context"))?;
        let mut probe_stats = GpuStats::default();
        let result = self.probe_locked(&mut inner, left, selection, options, &mut probe_stats);
        inner.stats.bytes_to_device += probe_stats.bytes_to_device;
        inner.stats.kernel_nanos += probe_stats.kernel_nanos;
        inner.stats.peak_device_bytes = inner
            .stats
            .peak_device_bytes
            .max(probe_stats.peak_device_bytes);
        record_process_stats(&probe_stats);
        result
    }

    fn probe_locked(
        &self,
        inner: &mut Inner,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        stats: &mut GpuStats,
    ) -> Result<PairList> {
        let device = &*self.device;
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
                    streamed = upload_part(device, host, stats)?;
                    let b = streamed.bytes;
                    (&streamed, b)
                }
            };
            let held = inner.resident_bytes + part_bytes;
            let (first_row, part_rows, ntiles) = self.parts_meta[p];
            let col_ids = inner.col_ids.as_ref();
            let mut out = PairList::default();
            let work_budget = self.budget.saturating_sub(held).max(1);
            let mut r0 = 0;
            // Shrinks when a radius chunk finds more pairs than the budget can hold.
            let mut max_rows = usize::MAX;
            while r0 < left.len() {
                let r1 = self
                    .chunk_end(left, r0, selection, work_budget)
                    .min(r0 + max_rows);
                match self.run_chunk(
                    part, first_row, part_rows, ntiles, col_ids, left, r0, r1, selection, options,
                    held, stats,
                )? {
                    Some(chunk) => {
                        out.extend_from(chunk);
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
            Selection::Nearest(k) => merge_nearest(per_part, k, self.metric.kind.is_similarity()),
            Selection::Within(_) => merge_within(per_part),
        })
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
        while r1 < left.len() && r1 - r0 < MAX_CHUNK_ROWS {
            let next = (r1 + step).min(left.len());
            let entries = (off[next] - off[r1]) as u64;
            // Entries go up twice for chebyshev (the raw slices and the sorted copy).
            let add = entries * 16 + (next - r1) as u64 * (out_per_row + 12);
            if bytes + add > budget / 2 && r1 > r0 {
                break;
            }
            bytes += add;
            r1 = next;
        }
        r1
    }

    #[allow(clippy::too_many_arguments)]
    fn run_chunk(
        &self,
        part: &DevPart,
        first_row: usize,
        part_rows: usize,
        ntiles: usize,
        col_ids: Option<&CudaSlice<i32>>,
        left: &SparseBatch,
        r0: usize,
        r1: usize,
        selection: Selection,
        options: ProbeOptions,
        held: u64,
        stats: &mut GpuStats,
    ) -> Result<Option<PairList>> {
        let device = &*self.device;
        let work: Vec<i32> = (r0..r1)
            .filter(|&r| !left.is_null(r))
            .map(|r| (r - r0) as i32)
            .collect();
        if work.is_empty() {
            return Ok(Some(PairList::default()));
        }
        let nwork = work.len();
        let self_first = match options.exclude_self_from {
            Some(first) => first as i64 + r0 as i64 - first_row as i64,
            None => NO_SELF,
        };
        let mut bytes = 0u64;
        // The left chunk as slices of the Arrow buffers: offsets are the row pointer.
        let off = &left.offsets()[r0..=r1];
        let (e0, e1) = (off[0] as usize, off[r1 - r0] as usize);
        let p = self.metric.p;
        let d = self.metric.dim.unwrap_or(1) as f64;

        let (k, cap, radius) = match selection {
            Selection::Nearest(k) => (
                k,
                cap_for(
                    k,
                    if is_cheb(&self.metric) {
                        CHEBYSHEV_THREADS
                    } else {
                        FOLDED_THREADS
                    },
                ),
                0.0,
            ),
            Selection::Within(r) => (1, 1, r),
        };
        let knn = matches!(selection, Selection::Nearest(_));
        // Everything this chunk needs at least; over the budget, the caller halves the chunk.
        let entries = (e1 - e0) as u64;
        let ncols_dense = self.columns.len().max(1) as u64;
        let needed = nwork as u64 * 4
            + (off.len() as u64 + 2 * entries) * 4
            + if knn {
                nwork as u64 * (k as u64 * 8 + 4)
            } else {
                64 * 16 + 8
            }
            + if is_cheb(&self.metric) {
                entries * 8 + (nwork as u64 + 1) * 4 + ncols_dense * 4
            } else {
                0
            };
        if held + needed > self.budget && r1 - r0 > 1 {
            return Ok(None);
        }
        let d_work = upload(device, &work, stats)?;
        bytes += nwork as u64 * 4;
        let mut out_rows = zeros::<u32>(device, if knn { nwork * k } else { 1 })?;
        let mut out_keys = zeros::<f32>(device, if knn { nwork * k } else { 1 })?;
        let mut out_count = zeros::<i32>(device, if knn { nwork } else { 1 })?;
        if knn {
            bytes += nwork as u64 * (k as u64 * 8 + 4);
        }
        // Radius: a pair list filled through an atomic counter; rerun with the exact size if full.
        let mut r_cap: u64 = if knn {
            1
        } else {
            // Room for 64 pairs per left row, within what the budget leaves (16 bytes a pair).
            let room = self.budget.saturating_sub(held + needed) / 16 / 2;
            ((nwork as u64) * 64).clamp(64, 1 << 24).min(room.max(64))
        };

        // Inputs particular to the kernel family.
        let cheb_inputs = if is_cheb(&self.metric) {
            Some(self.chebyshev_left(left, r0, r1, &work))
        } else {
            None
        };
        let d_off = upload(device, off, stats)?;
        let d_idx = upload(device, &left.indices()[e0..e1], stats)?;
        let d_val = upload(device, &left.values()[e0..e1], stats)?;
        bytes += (off.len() + 2 * (e1 - e0)) as u64 * 4;
        let dense_slots;
        let mut cheb_bufs = None;
        if let Some((ch_off, ch_col, ch_val)) = &cheb_inputs {
            let ncols = self.columns.len().max(1);
            let radius_bytes = if knn { 0 } else { r_cap * 16 + 8 };
            let room = self.budget.saturating_sub(held + needed + radius_bytes) + ncols as u64 * 4;
            dense_slots = ((room / (ncols as u64 * 4)) as usize)
                .clamp(1, (device.sm_count * 8) as usize)
                .min(nwork);
            let dense = zeros::<f32>(device, dense_slots * ncols)?;
            bytes += (dense_slots * ncols * 4 + ch_off.len() * 4 + ch_col.len() * 8) as u64;
            cheb_bufs = Some((
                upload(device, ch_off, stats)?,
                upload(device, ch_col, stats)?,
                upload(device, ch_val, stats)?,
                dense,
            ));
        } else {
            dense_slots = 0;
        }

        let mut pairs = PairList::default();
        loop {
            let mut r_left = zeros::<u32>(device, if knn { 1 } else { r_cap as usize })?;
            let mut r_right = zeros::<u32>(device, if knn { 1 } else { r_cap as usize })?;
            let mut r_dist = zeros::<f64>(device, if knn { 1 } else { r_cap as usize })?;
            let mut r_counter = zeros::<u64>(device, 1)?;
            let run_bytes = bytes + if knn { 0 } else { r_cap * 16 + 8 };
            stats.peak_device_bytes = stats.peak_device_bytes.max(held + run_bytes);

            let n_right = part_rows as i32;
            let kk = k as i32;
            let capi = cap as i32;
            let nwork_i = nwork as i32;
            let ncols = self.columns.len() as i32;
            let start = device
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda_err("recording an event"))?;
            if let Some((ch_off, ch_col, ch_val, dense)) = &cheb_bufs {
                let name = if knn {
                    "chebyshev_knn"
                } else {
                    "chebyshev_radius"
                };
                let smem = (if knn { cap * 8 } else { 0 } + CHEBYSHEV_THREADS as usize * 8) as u32;
                let f = device.function(name, smem)?;
                let mut b = device.stream.launch_builder(&f);
                b.arg(&d_work)
                    .arg(&nwork_i)
                    .arg(&self_first)
                    .arg(ch_off)
                    .arg(ch_col)
                    .arg(ch_val);
                b.arg(&n_right)
                    .arg(&part.valid_bits)
                    .arg(&ncols)
                    .arg(&part.r_ptr)
                    .arg(&part.r_col)
                    .arg(&part.r_val);
                b.arg(dense)
                    .arg(&kk)
                    .arg(&capi)
                    .arg(&mut out_rows)
                    .arg(&mut out_keys)
                    .arg(&mut out_count);
                b.arg(&radius)
                    .arg(&mut r_left)
                    .arg(&mut r_right)
                    .arg(&mut r_dist)
                    .arg(&mut r_counter)
                    .arg(&r_cap);
                let cfg = LaunchConfig {
                    grid_dim: (dense_slots as u32, 1, 1),
                    block_dim: (CHEBYSHEV_THREADS, 1, 1),
                    shared_mem_bytes: smem,
                };
                // SAFETY: the arguments match CHEB_PARAMS in kernels/knn.cu, every buffer is as
                // long as the kernel indexes it (dense holds dense_slots × ncols, the grid).
                unsafe { b.launch(cfg) }.map_err(cuda_err("launching the chebyshev kernel"))?;
            } else {
                let name = format!(
                    "{}_{}",
                    kernels::kernel_stem(self.metric.kind),
                    if knn { "knn" } else { "radius" }
                );
                let tile_rows = self.tile_rows.min(part_rows.div_ceil(32) * 32).max(32);
                let smem = (tile_rows * acc_bytes(self.metric.kind)
                    + if knn { cap * 8 } else { 0 }
                    + FOLDED_THREADS as usize * 12) as u32;
                let f = device.function(&name, smem)?;
                if log::log_enabled!(log::Level::Debug) {
                    log::debug!(
                        "GPU {name}: {nwork} left rows x {part_rows} right rows, tile {tile_rows} \
                         ({ntiles} tiles), {} registers, {smem} B shared, k {k}",
                        f.num_regs().unwrap_or(-1)
                    );
                }
                let l_base = off[0] as i64;
                let col_mode: i32 = matches!(self.columns, ColumnMap::Sorted(_)) as i32;
                let dummy_ids;
                let col_ids_arg = match col_ids {
                    Some(c) => c,
                    None => {
                        dummy_ids = zeros::<i32>(device, 1)?;
                        &dummy_ids
                    }
                };
                let tile_rows_i = tile_rows as i32;
                let ntiles_i = ntiles as i32;
                let mut b = device.stream.launch_builder(&f);
                b.arg(&d_off)
                    .arg(&l_base)
                    .arg(&d_idx)
                    .arg(&d_val)
                    .arg(&d_work)
                    .arg(&nwork_i)
                    .arg(&self_first);
                b.arg(&n_right)
                    .arg(&part.valid_bits)
                    .arg(&part.rt0)
                    .arg(&part.rt1);
                b.arg(&col_mode)
                    .arg(&ncols)
                    .arg(col_ids_arg)
                    .arg(&part.tile_ptr)
                    .arg(&part.col_rows)
                    .arg(&part.col_vals);
                b.arg(&tile_rows_i)
                    .arg(&ntiles_i)
                    .arg(&p)
                    .arg(&d)
                    .arg(&kk)
                    .arg(&capi);
                b.arg(&mut out_rows).arg(&mut out_keys).arg(&mut out_count);
                b.arg(&radius)
                    .arg(&mut r_left)
                    .arg(&mut r_right)
                    .arg(&mut r_dist)
                    .arg(&mut r_counter)
                    .arg(&r_cap);
                let cfg = LaunchConfig {
                    grid_dim: (nwork as u32, 1, 1),
                    block_dim: (FOLDED_THREADS, 1, 1),
                    shared_mem_bytes: smem,
                };
                // SAFETY: the arguments match KNN_PARAMS in kernels/knn.cu; the tiles were cut
                // with the same tile_rows (prepare_part), so tile_ptr has ntiles + 1 per column.
                unsafe { b.launch(cfg) }.map_err(cuda_err("launching the kernel"))?;
            }
            let end = device
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda_err("recording an event"))?;
            end.synchronize().map_err(cuda_err("running the kernel"))?;
            let ms = start
                .elapsed_ms(&end)
                .map_err(cuda_err("timing the kernel"))?;
            stats.kernel_nanos += (ms as f64 * 1e6) as u64;

            if knn {
                let counts = download(device, &out_count, nwork)?;
                let rows = download(device, &out_rows, nwork * k)?;
                let keys = download(device, &out_keys, nwork * k)?;
                for (w, &n) in counts.iter().enumerate() {
                    let lrow = (r0 + work[w] as usize) as u32;
                    for i in 0..n as usize {
                        pairs.left.push(lrow);
                        pairs.right.push(first_row as u32 + rows[w * k + i]);
                        pairs.distance.push(keys[w * k + i] as f64);
                    }
                }
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
                r_cap = found;
                continue;
            }
            let n = found as usize;
            let lefts = download(device, &r_left, n)?;
            let rights = download(device, &r_right, n)?;
            let dists = download(device, &r_dist, n)?;
            pairs.left = lefts.iter().map(|&l| (r0 as u32) + l).collect();
            pairs.right = rights.iter().map(|&r| first_row as u32 + r).collect();
            pairs.distance = dists;
            break;
        }
        Ok(Some(pairs))
    }

    /// Chebyshev's left rows: per work row its nonzeros as (column id or -1, x), largest |x|
    /// first (the kernel takes the first one a right row lacks).
    fn chebyshev_left(
        &self,
        left: &SparseBatch,
        r0: usize,
        _r1: usize,
        work: &[i32],
    ) -> (Vec<i32>, Vec<i32>, Vec<f32>) {
        let rows: Vec<Vec<(i32, f32)>> = work
            .par_iter()
            .map(|&w| {
                let (idx, val) = left.row(r0 + w as usize);
                let mut v: Vec<(i32, f32)> = idx
                    .iter()
                    .zip(val)
                    .filter(|(_, x)| **x != 0.0)
                    .map(|(&c, &x)| (self.columns.get(c).map_or(-1, |c| c as i32), x))
                    .collect();
                v.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
                v
            })
            .collect();
        let mut ch_off = Vec::with_capacity(work.len() + 1);
        ch_off.push(0i32);
        let total: usize = rows.iter().map(|r| r.len()).sum();
        let mut ch_col = Vec::with_capacity(total);
        let mut ch_val = Vec::with_capacity(total);
        for r in rows {
            for (c, x) in r {
                ch_col.push(c);
                ch_val.push(x);
            }
            ch_off.push(ch_col.len() as i32);
        }
        (ch_off, ch_col, ch_val)
    }
}

/// A rough size of rows `start..end` prepared for the device (to decide on parts).
fn estimate_bytes(
    right: &SparseBatch,
    start: usize,
    end: usize,
    metric: &Metric,
    columns: &ColumnMap,
    tile_rows: usize,
) -> u64 {
    let rows = (end - start) as u64;
    let nnz = (right.offsets()[end] - right.offsets()[start]) as u64;
    if is_cheb(metric) {
        rows * 4 + nnz * 8 + rows / 8 + 64
    } else {
        let ntiles = (end - start).div_ceil(tile_rows.max(1)) as u64;
        nnz * 8
            + rows * 2 * acc_bytes(metric.kind) as u64
            + columns.len() as u64 * 4 * (ntiles + 1)
            + rows / 8
            + 64
    }
}

fn valid_bits(right: &SparseBatch, start: usize, end: usize) -> Vec<u32> {
    let mut bits = vec![0u32; (end - start).div_ceil(32)];
    for r in start..end {
        if !right.is_null(r) {
            bits[(r - start) / 32] |= 1 << ((r - start) % 32);
        }
    }
    bits
}

fn prepare_part(
    right: &SparseBatch,
    start: usize,
    end: usize,
    metric: &Metric,
    columns: &ColumnMap,
    tile_rows: usize,
) -> HostPart {
    let rows = end - start;
    let mut part = HostPart {
        first_row: start,
        rows,
        valid_bits: valid_bits(right, start, end),
        ..Default::default()
    };
    if is_cheb(metric) {
        part.r_ptr.reserve(rows + 1);
        part.r_ptr.push(0);
        for r in start..end {
            let (idx, val) = right.row(r);
            let mut entries: Vec<(i32, f32)> = idx
                .iter()
                .zip(val)
                .filter(|(_, v)| **v != 0.0)
                .map(|(&c, &v)| {
                    (
                        columns.get(c).expect("a column of the right side") as i32,
                        v,
                    )
                })
                .collect();
            entries.sort_unstable_by_key(|e| e.0);
            for (c, v) in entries {
                part.r_col.push(c);
                part.r_val.push(v);
            }
            part.r_ptr.push(part.r_col.len() as u32);
        }
        return part;
    }
    // Totals in the kernel's accumulator type.
    let f64_acc = kernels::accumulates_in_f64(metric.kind);
    let totals: Vec<RowTotals> = with_semiring!(metric, s => (start..end)
        .into_par_iter()
        .map(|r| s.totals(right.row(r).1.iter().copied().filter(|x| *x != 0.0)))
        .collect());
    for t in &totals {
        if f64_acc {
            part.rt0.extend_from_slice(&t.t0.to_ne_bytes());
            part.rt1.extend_from_slice(&t.t1.to_ne_bytes());
        } else {
            part.rt0.extend_from_slice(&(t.t0 as f32).to_ne_bytes());
            part.rt1.extend_from_slice(&(t.t1 as f32).to_ne_bytes());
        }
    }
    // CSC over the part's rows, row-sorted within each column, built in parallel: each chunk of
    // rows counts its entries per column, the counts give every (column, chunk) its own output
    // range in row order, and the chunks fill their ranges at once.
    let ncols = columns.len();
    let nchunks = (rayon::current_num_threads() * 2)
        .min((256 << 20) / (ncols.max(1) * 4))
        .clamp(1, rows.max(1));
    let bounds: Vec<usize> = (0..=nchunks).map(|i| start + rows * i / nchunks).collect();
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
    let mut col_start = vec![0u32; ncols + 1];
    let mut chunk_offsets = vec![vec![0u32; ncols]; nchunks];
    let mut running = 0u32;
    for c in 0..ncols {
        col_start[c] = running;
        for ch in 0..nchunks {
            chunk_offsets[ch][c] = running;
            running += chunk_counts[ch][c];
        }
    }
    col_start[ncols] = running;
    let nnz = running as usize;
    part.col_rows = vec![0; nnz];
    part.col_vals = vec![0.0; nnz];
    {
        let rows_out = SharedOut(part.col_rows.as_mut_ptr());
        let vals_out = SharedOut(part.col_vals.as_mut_ptr());
        chunk_offsets
            .into_par_iter()
            .enumerate()
            .for_each(|(ch, mut fill)| {
                let (rows_out, vals_out) = (&rows_out, &vals_out);
                for r in bounds[ch]..bounds[ch + 1] {
                    let (idx, val) = right.row(r);
                    for (&c, &v) in idx.iter().zip(val) {
                        if v != 0.0 {
                            let slot = &mut fill[columns.get(c).unwrap() as usize];
                            // SAFETY: (column, chunk) ranges are disjoint and inside the buffers
                            // (their lengths are the counts of this very pass).
                            unsafe {
                                *rows_out.0.add(*slot as usize) = (r - start) as u32;
                                *vals_out.0.add(*slot as usize) = v;
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
    part.tile_ptr
        .par_chunks_mut(ntiles + 1)
        .enumerate()
        .for_each(|(c, tp)| {
            let (s, e) = (counts[c] as usize, counts[c + 1] as usize);
            let col = &part.col_rows[s..e];
            for (t, slot) in tp.iter_mut().enumerate() {
                let bound = (t * tile_rows) as u32;
                *slot = (s + col.partition_point(|&r| r < bound)) as u32;
            }
            tp[ntiles] = e as u32;
        });
    part
}

/// A buffer that parallel tasks write at disjoint positions.
struct SharedOut<T>(*mut T);
// SAFETY: only used for writes to disjoint positions (see prepare_part).
unsafe impl<T> Sync for SharedOut<T> {}

fn upload_part(device: &Device, host: &HostPart, stats: &mut GpuStats) -> Result<DevPart> {
    Ok(DevPart {
        valid_bits: upload(device, &host.valid_bits, stats)?,
        rt0: upload(device, &host.rt0, stats)?,
        rt1: upload(device, &host.rt1, stats)?,
        tile_ptr: upload(device, &host.tile_ptr, stats)?,
        col_rows: upload(device, &host.col_rows, stats)?,
        col_vals: upload(device, &host.col_vals, stats)?,
        r_ptr: upload(device, &host.r_ptr, stats)?,
        r_col: upload(device, &host.r_col, stats)?,
        r_val: upload(device, &host.r_val, stats)?,
        bytes: host.device_bytes(),
    })
}

/// Merges the parts' top-k lists (each ordered by left row, then rank) into one.
fn merge_nearest(mut parts: Vec<PairList>, k: usize, similarity: bool) -> PairList {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut cursors = vec![0usize; parts.len()];
    let mut out = PairList::default();
    let mut row_pairs: Vec<(f64, u32)> = Vec::new();
    loop {
        // The smallest left row any part still has.
        let next = parts
            .iter()
            .zip(&cursors)
            .filter_map(|(p, &c)| p.left.get(c).copied())
            .min();
        let Some(lrow) = next else { break };
        row_pairs.clear();
        for (p, c) in parts.iter().zip(cursors.iter_mut()) {
            while *c < p.len() && p.left[*c] == lrow {
                let d = p.distance[*c];
                row_pairs.push((if similarity { -d } else { d }, p.right[*c]));
                *c += 1;
            }
        }
        row_pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for &(key, r) in row_pairs.iter().take(k) {
            out.left.push(lrow);
            out.right.push(r);
            out.distance.push(if similarity { -key } else { key });
        }
    }
    out
}

/// Radius pairs of all parts and chunks, ordered by left row then right row.
fn merge_within(parts: Vec<PairList>) -> PairList {
    let mut all: Vec<(u64, f64)> = parts
        .into_iter()
        .flat_map(|p| {
            p.left
                .into_iter()
                .zip(p.right)
                .zip(p.distance)
                .map(|((l, r), d)| (((l as u64) << 32) | r as u64, d))
                .collect::<Vec<_>>()
        })
        .collect();
    all.par_sort_unstable_by_key(|e| e.0);
    let mut out = PairList::default();
    for (key, d) in all {
        out.left.push((key >> 32) as u32);
        out.right.push(key as u32);
        out.distance.push(d);
    }
    out
}

/// Appends `other` to `self` (both ordered by left row; `other` starts later).
trait Append {
    fn extend_from(&mut self, other: PairList);
}
impl Append for PairList {
    fn extend_from(&mut self, mut other: PairList) {
        self.left.append(&mut other.left);
        self.right.append(&mut other.right);
        self.distance.append(&mut other.distance);
    }
}
