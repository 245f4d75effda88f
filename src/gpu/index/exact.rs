//! The certified metrics' exact step on the device (kernels/exact.cu): the right side's rows
//! sorted by column stay on the device beside the inverted lists, a probe's left rows go up
//! sorted, and every candidate pair is reduced over the union of its two rows there (its terms
//! summed in the CPU's order); the host only finishes each reduced sum (`ExactRows::
//! finish_reduced`, one call a pair) and selects. The pairs sharing no column are taken by the
//! folded kernels themselves from the rows' one-sided sums (`disjoint_offer` in knn.cu), computed
//! here by the same terms in the same order, so their keys are the exact step's own sums.
//!
//! Why: with a column in nearly every row, the host's walk of both rows per candidate and its
//! search of the rows sharing no column (every right row checked against every left row) took
//! 10-500x the kernels' time.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use datafusion::common::Result;
use rayon::prelude::*;

use super::super::args::ExactArgs;
use super::super::device::{cuda_err, Device};
use super::super::memory::{addr, download, upload, zeros};
use super::super::stats::GpuStats;
use super::certified::{
    into_pairs, keep_answer, left_row_starts, log_certified, row_settled, Bounds,
};
use crate::join::{Cancel, ExactRows, PairList, ProbeOptions, Selection};
use crate::metric::sorted_nonzeros_into;
use crate::vector::SparseBatch;

use super::*;

/// Candidate pairs reduced by one launch of `exact_pairs` (16 bytes each on the device).
const EXACT_PAIRS_PER_LAUNCH: usize = 1 << 22;

/// Rows as the exact step reads them: sorted CSR, each entry (column, value bits) in one word.
pub(super) struct DevRows {
    ptr: CudaSlice<i64>,
    entries: CudaSlice<u64>,
    /// Each row's one-sided sum (`exact_one_sided`), where the kernels take the pairs sharing no
    /// column.
    one_sided: Option<CudaSlice<f64>>,
    pub(super) bytes: u64,
}

/// One word per entry: the column in the low half, the value's bits in the high (a `uint2` on the
/// device, little-endian).
fn pack(entries: &[(i32, f32)]) -> Vec<u64> {
    entries
        .par_iter()
        .map(|&(c, v)| (c as u32 as u64) | ((v.to_bits() as u64) << 32))
        .collect()
}

/// A probe's left rows sorted by column, zeros (and null rows) left out, as row pointers and
/// entries.
fn sorted_left(left: &SparseBatch) -> (Vec<i64>, Vec<(i32, f32)>) {
    let rows: Vec<Vec<(i32, f32)>> = (0..left.len())
        .into_par_iter()
        .map_init(Vec::new, |buffer, l| {
            if left.is_null(l) {
                return Vec::new();
            }
            sorted_nonzeros_into(left.row(l), buffer);
            buffer.clone()
        })
        .collect();
    let mut ptr = Vec::with_capacity(rows.len() + 1);
    ptr.push(0i64);
    for row in &rows {
        ptr.push(ptr.last().expect("ptr starts at 0") + row.len() as i64);
    }
    (ptr, rows.concat())
}

impl DevRows {
    /// Device bytes of the right side's rows.
    pub(super) fn bytes_for(exact: &ExactRows) -> u64 {
        let (ptr, entries) = exact.sorted_rows();
        (ptr.len() * 8 + entries.len() * 8 + ptr.len() * 8) as u64
    }

    /// Rows `ptr` / `entries` on `device`, with their one-sided sums when `side` is given (0:
    /// left rows, 1: right rows). Waits for the copies and the sums, so that the probes' other
    /// lanes may read them.
    fn upload(
        device: &Device,
        program: &MetricProgram,
        ptr: &[i64],
        entries: &[(i32, f32)],
        side: Option<i32>,
        stats: &mut GpuStats,
    ) -> Result<Self> {
        let rows = ptr.len() - 1;
        let d_ptr = upload(device, ptr, stats)?;
        let d_entries = upload(device, &pack(entries), stats)?;
        let one_sided = match side {
            Some(side) => {
                let sums = zeros::<f64>(device, rows)?;
                let args = ExactArgs {
                    l_ptr: addr(device, &d_ptr),
                    l_ent: addr(device, &d_entries),
                    n: rows as i64,
                    side,
                    p: program.params.p,
                    d: program.params.d,
                    out: addr(device, &sums),
                    ..ExactArgs::default()
                };
                launch(device, program, "exact_one_sided", &args, rows, stats)?;
                Some(sums)
            }
            None => {
                device
                    .stream
                    .synchronize()
                    .map_err(cuda_err("copying to the device"))?;
                None
            }
        };
        Ok(DevRows {
            ptr: d_ptr,
            entries: d_entries,
            one_sided,
            bytes: (ptr.len() * 16 + entries.len() * 8) as u64,
        })
    }

    /// The right side's rows of `exact`, with their one-sided sums where the kernels take the
    /// pairs sharing no column ([`ExactRows::finds_disjoint_rows`]).
    pub(super) fn right(
        device: &Device,
        program: &MetricProgram,
        exact: &ExactRows,
        stats: &mut GpuStats,
    ) -> Result<Self> {
        let (ptr, entries) = exact.sorted_rows();
        let ptr: Vec<i64> = ptr.iter().map(|&p| p as i64).collect();
        let side = exact.finds_disjoint_rows().then_some(1);
        Self::upload(device, program, &ptr, entries, side, stats)
    }
}

/// Launches `name` (`exact_pairs` or `exact_one_sided`) over `n` items, a thread each, and waits.
fn launch(
    device: &Device,
    program: &MetricProgram,
    name: &'static str,
    args: &ExactArgs,
    n: usize,
    stats: &mut GpuStats,
) -> Result<()> {
    if n == 0 {
        return device
            .stream
            .synchronize()
            .map_err(cuda_err("running the exact step"));
    }
    let f = device.function(program, name, 0)?;
    let threads = 128u32;
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(threads as usize).min(1 << 20) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let start = device
        .stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(cuda_err("recording an event"))?;
    let mut b = device.stream.launch_builder(&f);
    b.arg(args);
    // SAFETY: `ExactArgs` is the kernel's one parameter (its CUDA twin generated from it); the
    // row pointers have a row more than the rows the pairs (or `n`) name, every pair's rows are
    // below those counts (the left batch's, the index's), and the buffers outlive the launch
    // (waited on below).
    unsafe { b.launch(cfg) }.map_err(cuda_err("launching the exact step"))?;
    let end = device
        .stream
        .record_event(Some(crate::gpu::device::WAITED_EVENT))
        .map_err(cuda_err("recording an event"))?;
    end.synchronize()
        .map_err(cuda_err("running the exact step"))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(cuda_err("timing the exact step"))?;
    stats.kernel_nanos += (ms as f64 * 1e6) as u64;
    Ok(())
}

impl GpuIndex {
    /// The right side's rows on the device for the exact step, when they fit beside the one part
    /// that stays there (streamed parts and `SPARSE_KNN_GPU_EXACT=host` keep the host's step).
    pub(super) fn upload_exact_rows(&mut self) -> Result<()> {
        let Some(exact) = self.exact.clone() else {
            return Ok(());
        };
        if self.inner.resident.is_none()
            || std::env::var("SPARSE_KNN_GPU_EXACT").is_ok_and(|v| v == "host")
        {
            return Ok(());
        }
        let bytes = DevRows::bytes_for(&exact);
        // (room for a probe's left rows and pairs beside them too)
        if self.inner.resident_bytes + 2 * bytes > self.budget {
            log::debug!(
                "GPU {}: the exact step stays on the host ({bytes} bytes of rows do not fit)",
                self.program.name
            );
            return Ok(());
        }
        let lanes = self.device.take_all_lanes();
        let device = lanes.device();
        device
            .ctx
            .bind_to_thread()
            .map_err(cuda_err("binding the CUDA context"))?;
        let mut stats = GpuStats::default();
        let rows = DevRows::right(device, &self.program, &exact, &mut stats)?;
        drop(lanes);
        self.inner.resident_bytes += rows.bytes;
        let mut all = self
            .stats
            .lock()
            .map_err(|_| datafusion::common::exec_datafusion_err!("GPU: a build panicked"))?;
        all.bytes_to_device += stats.bytes_to_device;
        all.kernel_nanos += stats.kernel_nanos;
        all.peak_device_bytes = all.peak_device_bytes.max(self.inner.resident_bytes);
        drop(all);
        self.exact_rows = Some(rows);
        Ok(())
    }

    /// Reduced sums of the pairs (`left_of[i]`, `right[i]`) on the device, finished on the host.
    fn exact_distances(
        &self,
        right_rows: &DevRows,
        left_rows: &DevRows,
        left_of: &[u32],
        right: &[u32],
        stats: &mut GpuStats,
    ) -> Result<Vec<f64>> {
        let exact = self
            .exact
            .as_ref()
            .expect("certified metrics keep the exact rows");
        let mut out = Vec::with_capacity(left_of.len());
        for at in (0..left_of.len()).step_by(EXACT_PAIRS_PER_LAUNCH) {
            let end = (at + EXACT_PAIRS_PER_LAUNCH).min(left_of.len());
            let reduced = self.with_device(|_, lanes| {
                let device = lanes.device();
                let d_left = upload(device, &left_of[at..end], stats)?;
                let d_right = upload(device, &right[at..end], stats)?;
                let d_out = zeros::<f64>(device, end - at)?;
                let args = ExactArgs {
                    l_ptr: addr(device, &left_rows.ptr),
                    l_ent: addr(device, &left_rows.entries),
                    r_ptr: addr(device, &right_rows.ptr),
                    r_ent: addr(device, &right_rows.entries),
                    pair_left: addr(device, &d_left),
                    pair_right: addr(device, &d_right),
                    n: (end - at) as i64,
                    side: 0,
                    p: self.program.params.p,
                    d: self.program.params.d,
                    out: addr(device, &d_out),
                };
                launch(device, &self.program, "exact_pairs", &args, end - at, stats)?;
                download(device, &d_out, end - at)
            })?;
            out.extend(reduced);
        }
        out.par_iter_mut()
            .for_each(|d| *d = exact.finish_reduced(*d));
        Ok(out)
    }

    /// [`GpuIndex::probe_certified`] with the exact step on the device (k nearest up to the
    /// kernels' top-k, or a radius): the same passes, the same rule for when a left row is
    /// settled, the candidates' distances from [`GpuIndex::exact_distances`], and the pairs
    /// sharing no column taken by the kernels from the one-sided sums instead of by the host.
    pub(super) fn probe_certified_on_device(
        &self,
        right_rows: &DevRows,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        stats: &mut GpuStats,
    ) -> Result<PairList> {
        let exact = self
            .exact
            .as_ref()
            .expect("certified metrics keep the exact rows");
        let started = std::time::Instant::now();
        let disjoint = exact.finds_disjoint_rows();
        let (ptr, entries) = sorted_left(left);
        let left_rows = self.with_device(|_, lanes| {
            let side = disjoint.then_some(0);
            DevRows::upload(lanes.device(), &self.program, &ptr, &entries, side, stats)
        })?;
        drop((ptr, entries));
        let one_sided = match (&left_rows.one_sided, &right_rows.one_sided) {
            (Some(l), Some(r)) => Some((addr(&self.device, l), addr(&self.device, r))),
            _ => None,
        };
        let uploaded = started.elapsed().as_secs_f64();
        let mut rows: Vec<Vec<(f64, u32)>> = vec![Vec::new(); left.len()];
        let mut first_pairs = 0;
        let (row_radius, active_rows): (Option<Vec<f64>>, Option<Vec<bool>>) = match selection {
            Selection::Nearest(k) => {
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
                            shared_only: disjoint,
                            active_rows: None,
                            one_sided,
                            mask: None,
                            groups: None,
                        },
                    )
                })?;
                first_pairs = lower.len();
                let distances =
                    self.exact_distances(right_rows, &left_rows, &lower.left, &lower.right, stats)?;
                let starts = left_row_starts(&lower.left, left.len());
                let (radius, open): (Vec<f64>, Vec<bool>) = rows
                    .par_iter_mut()
                    .enumerate()
                    .map(|(l, row)| {
                        let range = starts[l]..starts[l + 1];
                        row.extend(range.clone().map(|i| (distances[i], lower.right[i])));
                        keep_answer(row, selection);
                        row_settled(row, &lower, range, k, wide)
                    })
                    .unzip();
                if !open.contains(&true) {
                    let timing = [uploaded, started.elapsed().as_secs_f64()];
                    log_certified(left.len(), first_pairs, (0, 0), &rows, started, timing);
                    return Ok(into_pairs(rows));
                }
                (Some(radius), Some(open))
            }
            Selection::Within(_) => (None, None),
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
                    shared_only: disjoint,
                    active_rows: active_rows.as_deref(),
                    one_sided,
                    mask: None,
                    groups: None,
                },
            )
        })?;
        cancel.check()?;
        // Grouped by left row (a counting sort): a warp of the exact step then reads one left row.
        let starts = left_row_starts(&candidates.left, left.len());
        let mut fill = starts.clone();
        let mut by_left = vec![0u32; candidates.len()];
        let mut left_of = vec![0u32; candidates.len()];
        for (&l, &j) in candidates.left.iter().zip(&candidates.right) {
            by_left[fill[l as usize]] = j;
            left_of[fill[l as usize]] = l;
            fill[l as usize] += 1;
        }
        let found = candidates.len();
        drop(candidates);
        let distances = self.exact_distances(right_rows, &left_rows, &left_of, &by_left, stats)?;
        rows.par_iter_mut().enumerate().for_each(|(l, row)| {
            let range = starts[l]..starts[l + 1];
            row.extend(range.map(|i| (distances[i], by_left[i])));
            keep_answer(row, selection);
        });
        let second_rows = active_rows.map_or(left.len(), |a| a.iter().filter(|&&o| o).count());
        log_certified(
            left.len(),
            first_pairs,
            (second_rows, found),
            &rows,
            started,
            [uploaded, first_done],
        );
        Ok(into_pairs(rows))
    }
}
