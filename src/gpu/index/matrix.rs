//! The distance matrix on the device (`JoinIndex::distance_matrix`): for the folded metrics, every
//! left row against every right row finished into a block of float64 on the device by
//! `distance_matrix` (kernels/matrix.cu) and copied out once per chunk of left rows, straight into
//! the caller's array. The default (a probe within an infinite radius) sent every pair back
//! through the host as (left, right, distance) and placed it: 3.6 s for news20's 10,000 x 10,000
//! cosine on an H200, where this takes 0.05-0.17 s (kernels 8 ms, the rest the copy out; the
//! slower figure is a fresh array's first touch). The other metrics (a max, or an exact union
//! term: chebyshev, minkowski, hellinger, jensenshannon) and a right side streamed in parts still
//! take that probe.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::common::{exec_datafusion_err, exec_err, Result};
use rayon::prelude::*;

use super::super::args::MatrixArgs;
use super::super::device::{cuda_err, is_out_of_memory, Lanes};
use super::super::kernels::MATRIX_THREADS;
use super::super::memory::{addr, download_rows, upload};
use super::super::prepare::list_entry;
use super::super::stats::{record_process_stats, GpuStats};
use crate::join::{advise_huge_pages_of, matrix_by_probe, MatrixOut, MatrixRows};
use crate::metric::{with_semiring, Metric, RowTotals, Semiring};
use crate::vector::SparseBatch;

use super::*;

/// Device bytes of one chunk's block of distances, at most: a few large copies out (each as fast
/// as one of all the rows), while the rest of the budget stays for other probes.
const MATRIX_CHUNK_BYTES: u64 = 512 << 20;

/// `SPARSE_KNN_GPU_MATRIX=probe`: every metric takes the probe (to compare the two).
fn kernel_allowed() -> bool {
    std::env::var("SPARSE_KNN_GPU_MATRIX").as_deref() != Ok("probe")
}

/// Testing knobs, read on every call: left rows per chunk at most
/// (`SPARSE_KNN_GPU_MATRIX_ROWS`), the lists' tiles per matrix tile
/// (`SPARSE_KNN_GPU_MATRIX_GROUP`), and every copy out staged in pieces of at most so many bytes
/// (`SPARSE_KNN_GPU_MATRIX_PIECE_BYTES`), so that small inputs cross chunks, tiles and pieces.
fn knob(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map(|v| v.max(1))
}

/// The chunk's left rows as the kernel reads them, made on the host.
struct LeftChunk {
    hit_off: Vec<i64>,
    hits: Vec<u64>,
    lt0: Vec<f64>,
    lt1: Vec<f64>,
    null: Vec<u8>,
}

impl GpuIndex {
    /// Whether [`crate::join::JoinIndex::distance_matrix`] runs the matrix kernel for this index:
    /// a folded metric (the CPU's dense block's: a sum, no exact union term) and a right side
    /// that stays on the device. Otherwise it probes within an infinite radius.
    pub fn matrix_on_device(&self) -> bool {
        self.program.folded && self.inner.resident.is_some() && kernel_allowed()
    }

    /// See [`crate::join::JoinIndex::distance_matrix`]: the folded metrics on the device, the
    /// others (and a right side streamed in parts) by a probe within an infinite radius.
    pub(crate) fn distance_matrix_on_device(
        &self,
        metric: &Metric,
        left: MatrixRows<'_>,
        out: MatrixOut<'_>,
    ) -> Result<()> {
        with_semiring!(metric, s => self.matrix_with(&s, metric, left, out))
    }

    fn matrix_with<S: Semiring>(
        &self,
        s: &S,
        metric: &Metric,
        left: MatrixRows<'_>,
        mut out: MatrixOut<'_>,
    ) -> Result<()> {
        let rows = left.rows();
        out.check(rows.len())?;
        if out.columns != self.rows {
            return exec_err!(
                "GPU: a distance matrix against this index has {} columns (its rows), got {}",
                self.rows,
                out.columns
            );
        }
        if left.is_own() && rows.len() != self.rows {
            return exec_err!(
                "GPU: the index's own rows are {} rows, got {}",
                self.rows,
                rows.len()
            );
        }
        if S::NAME != self.program.name {
            return exec_err!(
                "GPU: a distance matrix under {} from an index built for {}",
                S::NAME,
                self.program.name
            );
        }
        if !self.matrix_on_device() {
            return matrix_by_probe(self, metric, rows, out);
        }
        if rows.is_empty() || self.rows == 0 {
            return Ok(());
        }
        // Written once, by the copies: 2 MiB pages take a fault where 4 KiB ones took 512.
        let used = (rows.len() - 1) * out.stride + out.columns;
        advise_huge_pages_of(&mut out.values[..used]);
        let mut stats = GpuStats::default();
        let result = self.with_device(|inner, lanes| {
            self.matrix_locked(s, inner, lanes, rows, &mut out, &mut stats)
        });
        let mut held = self
            .stats
            .lock()
            .map_err(|_| exec_datafusion_err!("GPU: a probe panicked"))?;
        held.bytes_to_device += stats.bytes_to_device;
        held.kernel_nanos += stats.kernel_nanos;
        held.peak_device_bytes = held.peak_device_bytes.max(stats.peak_device_bytes);
        drop(held);
        record_process_stats(&stats);
        result
    }

    fn matrix_locked<S: Semiring>(
        &self,
        s: &S,
        inner: &Inner,
        lanes: &Lanes<'_>,
        left: &SparseBatch,
        out: &mut MatrixOut<'_>,
        stats: &mut GpuStats,
    ) -> Result<()> {
        let device = lanes.device();
        let part = &inner.resident.as_ref().expect("a resident right side")[0];
        let (_, n, ntiles) = self.parts_meta[0];
        let m = left.len();
        let accs = if S::TWO_ACCUMULATORS { 2 } else { 1 };
        // A matrix tile: as many of the lists' tiles as a quarter of a SM's shared memory holds
        // (four blocks a SM), less the kernel's own arrays; never fewer than one (the lists'
        // tiles were sized for the knn kernels' accumulators, as large as these).
        let static_smem = MATRIX_THREADS as usize * 20 + 1024;
        let room = (device.smem_per_sm as usize / 4).saturating_sub(static_smem + 1024);
        let tile_bytes = self.tile_rows * accs * 8;
        let group = knob("SPARSE_KNN_GPU_MATRIX_GROUP")
            .unwrap_or(room / tile_bytes.max(1))
            .clamp(1, ntiles);
        let mtile_rows = group * self.tile_rows;
        let mtiles = n.div_ceil(mtile_rows);
        let span = mtile_rows.min(n);
        let smem = span * accs * 8;
        if smem + static_smem > device.smem_optin as usize {
            return exec_err!(
                "GPU: a distance matrix tile of {span} rows needs {} bytes of shared memory, the \
                 device allows {}",
                smem + static_smem,
                device.smem_optin
            );
        }
        let f = device.function(&self.program, "distance_matrix", smem as u32)?;

        // Left rows per chunk: the block and the chunk's rows fit the budget this lane shares.
        let held = inner.resident_bytes;
        let budget = self.budget.saturating_sub(held) / lanes.sharing_budget();
        let row_bytes = (n * 8) as u64;
        let mut chunk_rows = ((budget / 2).min(MATRIX_CHUNK_BYTES) / row_bytes).max(1) as usize;
        if let Some(forced) = knob("SPARSE_KNN_GPU_MATRIX_ROWS") {
            chunk_rows = chunk_rows.min(forced);
        }
        chunk_rows = chunk_rows.min(m);
        // One block for every chunk, smaller where another index took the memory it counted on.
        let block = loop {
            // SAFETY: every value a chunk's rows take is written by the kernel before it is read.
            match unsafe { device.stream.alloc::<f64>(chunk_rows * n) } {
                Ok(block) => break block,
                Err(e) => {
                    let e = cuda_err("allocating a distance matrix's block")(e);
                    if !is_out_of_memory(&e) || chunk_rows == 1 {
                        return Err(e);
                    }
                    chunk_rows = chunk_rows.div_ceil(2);
                }
            }
        };
        stats.peak_device_bytes = held + (chunk_rows * n * 8) as u64;
        let started = std::time::Instant::now();
        let mut copying = std::time::Duration::ZERO;
        let mut r0 = 0;
        while r0 < m {
            let r1 = (r0 + chunk_rows).min(m);
            let chunk = self.left_chunk(s, left, r0..r1);
            let hit_off = upload(device, &chunk.hit_off, stats)?;
            let hits = upload(device, &chunk.hits, stats)?;
            let lt0 = upload(device, &chunk.lt0, stats)?;
            let lt1 = upload(device, &chunk.lt1, stats)?;
            let null = upload(device, &chunk.null, stats)?;
            let args = MatrixArgs {
                hit_off: addr(device, &hit_off),
                hits: addr(device, &hits),
                lt0: addr(device, &lt0),
                lt1: addr(device, &lt1),
                l_null: addr(device, &null),
                n_right: n as i32,
                valid_bits: if part.all_valid {
                    0
                } else {
                    addr(device, &part.valid_bits)
                },
                rt0: addr(device, &part.rt0),
                rt1: addr(device, &part.rt1),
                tile_ptr: addr(device, &part.tile_ptr),
                col_entries: addr(device, &part.col_entries),
                col_lift: addr(device, &part.col_lift),
                ntiles: ntiles as i32,
                group: group as i32,
                mtile_rows: mtile_rows as i32,
                mtiles: mtiles as i32,
                span: span as i32,
                p: self.program.params.p,
                d: self.program.params.d,
                out: addr(device, &block),
                out_stride: n as i64,
            };
            let cfg = LaunchConfig {
                grid_dim: ((r1 - r0) as u32, mtiles.min(65_535) as u32, 1),
                block_dim: (MATRIX_THREADS, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            let start = device
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda_err("recording an event"))?;
            let mut b = device.stream.launch_builder(&f);
            b.arg(&args);
            // SAFETY: `MatrixArgs` is the kernel's one parameter (its CUDA declaration is
            // generated from the Rust struct, with offsets checked). Every hit's column id is
            // below the lists' column count (mapped by `self.columns`), `tile_ptr` holds ntiles
            // + 1 pointers a column, every list entry's row is below n and inside its matrix
            // tile (mtile_rows = group tiles of the lists), the block holds (r1 - r0) x n values
            // and `smem` bytes hold `span` accumulators of each kind; the buffers outlive the
            // launch (the copy below waits for it).
            unsafe { b.launch(cfg) }.map_err(cuda_err("launching the kernel"))?;
            let end = device
                .stream
                .record_event(Some(crate::gpu::device::WAITED_EVENT))
                .map_err(cuda_err("recording an event"))?;
            end.synchronize()
                .map_err(cuda_err("computing a distance matrix"))?;
            let ms = start
                .elapsed_ms(&end)
                .map_err(cuda_err("timing the kernel"))?;
            stats.kernel_nanos += (ms as f64 * 1e6) as u64;
            let copy = std::time::Instant::now();
            let (stride, columns) = (out.stride, out.columns);
            let rows_out = out.rows_from(r0);
            let pieces = knob("SPARSE_KNN_GPU_MATRIX_PIECE_BYTES");
            let rows_out = (rows_out.values, stride);
            download_rows(device, &block, (r1 - r0, columns), rows_out, pieces)?;
            copying += copy.elapsed();
            r0 = r1;
        }
        log::debug!(
            "GPU {} {}: a {m} x {n} distance matrix in {:?} ({copying:?} copying out; \
             {chunk_rows}-row chunks, tiles of {mtile_rows} rows, kernels {:.3} ms)",
            device.ordinal,
            self.program.name,
            started.elapsed(),
            stats.kernel_nanos as f64 * 1e-6
        );
        Ok(())
    }

    /// Left rows `range` as the kernel reads them: each row's nonzeros in its stored order,
    /// mapped to the right side's column ids (zeros and columns the right side lacks, which
    /// share nothing, left out), and its totals, the CPU's own (`Semiring::totals` of its
    /// nonzeros, as `folded::classify` takes them).
    fn left_chunk<S: Semiring>(
        &self,
        s: &S,
        left: &SparseBatch,
        range: std::ops::Range<usize>,
    ) -> LeftChunk {
        let per_row: Vec<(RowTotals, bool, Vec<u64>)> = range
            .into_par_iter()
            .with_min_len(64)
            .map(|r| {
                if left.is_null(r) {
                    return (RowTotals::default(), true, Vec::new());
                }
                let (indices, values) = left.row(r);
                let totals = s.totals(values.iter().copied().filter(|v| *v != 0.0));
                let hits = indices
                    .iter()
                    .zip(values)
                    .filter(|&(_, &x)| x != 0.0)
                    .filter_map(|(&c, &x)| Some(list_entry(self.columns.get(c)?, x)))
                    .collect();
                (totals, false, hits)
            })
            .collect();
        let mut chunk = LeftChunk {
            hit_off: Vec::with_capacity(per_row.len() + 1),
            hits: Vec::with_capacity(per_row.iter().map(|r| r.2.len()).sum()),
            lt0: Vec::with_capacity(per_row.len()),
            lt1: Vec::with_capacity(per_row.len()),
            null: Vec::with_capacity(per_row.len()),
        };
        chunk.hit_off.push(0);
        for (totals, null, hits) in per_row {
            chunk.hits.extend_from_slice(&hits);
            chunk.hit_off.push(chunk.hits.len() as i64);
            chunk.lt0.push(totals.t0);
            chunk.lt1.push(totals.t1);
            chunk.null.push(u8::from(null));
        }
        chunk
    }
}
