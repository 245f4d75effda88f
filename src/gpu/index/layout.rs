//! What a build settles before it prepares anything (the kernels, the column ids, the tile
//! height, the parts of the right side), the parts prepared on the host, and their upload.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use datafusion::common::{exec_err, Result};
use rayon::prelude::*;

use super::super::device::{cuda_err, Device};
use super::super::kernels::MetricProgram;
use super::super::launch::{folded_fixed_smem, folded_smem_without_map};
use super::super::lists::{self, ListSource, RowsOnDevice};
use super::super::memory::upload;
use super::super::prepare::{
    choose_dense_columns, choose_dense_from, estimate_bytes, prepare_part, upload_part, ColumnMap,
    ColumnProfile, DenseColumns, DevPart, HostPart, PartShape,
};
use super::super::stats::{record_process_stats, GpuOptions, GpuStats};
use crate::join::ExactRows;
use crate::metric::{RowTotals, Semiring};
use crate::vector::SparseBatch;

use super::*;

/// What a build settles before it prepares anything: the kernels, the column ids, the tile
/// height and the parts (row ranges) of the right side.
#[derive(Clone)]
pub(super) struct Layout {
    pub(super) program: MetricProgram,
    pub(super) columns: ColumnMap,
    pub(super) tile_rows: usize,
    pub(super) budget: u64,
    pub(super) ranges: Vec<(usize, usize)>,
    /// Bilinear metrics on tensor cores: the columns multiplied as a dense block.
    pub(super) dense: Option<DenseColumns>,
    /// The one part's inverted lists are built on the device ([`super::lists`]).
    pub(super) lists_on_device: bool,
}
impl Layout {
    /// `profile`: the right side's column profile when known (kept in an index file), else
    /// found here.
    pub(super) fn of<S: Semiring>(
        device: &Device,
        right: &SparseBatch,
        s: &S,
        budget: u64,
        options: &GpuOptions,
        profile: Option<&ColumnProfile>,
    ) -> Self {
        let started = std::time::Instant::now();
        let program = MetricProgram::of(s);
        let rows = right.len();
        // Column ids: the indices themselves when the index space is not much larger than the
        // data, else the sorted distinct indices (found by binary search on the device).
        let columns = match profile {
            Some(p) => p.columns.clone(),
            None => ColumnMap::of(std::slice::from_ref(right)),
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
                let (choice, most) = (options.dense_columns, budget / 5);
                let d = match profile {
                    Some(p) => choose_dense_from(p, rows, choice, most),
                    None => choose_dense_columns(right, &columns, choice, most),
                };
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
    pub(super) fn prepare_with_exact<S: Semiring>(
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
    pub(super) fn prepare<S: Semiring>(&self, right: &SparseBatch, s: &S) -> Vec<HostPart> {
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
/// Right rows per tile of the folded kernels on `device`.
pub(super) fn tile_rows(device: &Device, program: &MetricProgram) -> usize {
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
pub(super) fn check_size(right: &SparseBatch) -> Result<()> {
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
pub(super) struct Uploaded {
    /// The right side's one part (None when its parts are streamed per probe).
    pub(super) resident: Option<Vec<DevPart>>,
    /// Its parts, kept on the host when they are streamed (set by the caller, who owns them).
    pub(super) host_parts: Option<Vec<HostPart>>,
    pub(super) col_ids: Option<CudaSlice<i32>>,
    pub(super) resident_bytes: u64,
}
/// Uploads the prepared right side to `device`: the column ids and `resident`, the one part
/// that stays (None when there are several parts: they stay on the host, streamed per probe).
pub(super) fn upload_layout(
    device: &Device,
    layout: &Layout,
    right: &SparseBatch,
    resident: Option<&HostPart>,
    rows: Option<&RowsOnDevice>,
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
                rows,
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
