//! One probe: left rows cut into launches by the memory budget, each launch run on every part of
//! the right side (resident, or streamed through the device), and the parts' answers merged.

use datafusion::common::Result;

use super::super::device::{cuda_err, is_out_of_memory, Lanes};
use super::super::launch::PartLaunch;
use super::super::memory::{download, upload};
use super::super::prepare::{upload_part, DevPart};
use super::super::stats::GpuStats;
use crate::join::{
    merge_nearest, merge_within, Cancel, PairList, ProbeOptions, RowMask, Selection,
};
use crate::vector::SparseBatch;

use super::*;

impl GpuIndex {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn probe_locked(
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
            let masked = match bounds.mask {
                Some(mask) => Some(mask_bits(device, part, mask, first_row, part_rows, stats)?),
                None => None,
            };
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
                one_sided: bounds.one_sided.filter(|_| bounds.shared_only),
                valid_bits: masked.as_ref(),
                groups: bounds.groups,
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

    /// The end of the left chunk that starts at `r0`: its upload and outputs fit `budget`.
    pub(super) fn chunk_end(
        &self,
        left: &SparseBatch,
        r0: usize,
        selection: Selection,
        budget: u64,
    ) -> usize {
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
}

/// The valid bits of a masked probe's part (rows `first_row..first_row + rows` of the index): a
/// bit per row, set where the row is valid (not NULL) and the mask passes it, on the device for
/// the kernels to read in place of the part's own.
fn mask_bits(
    device: &Device,
    part: &DevPart,
    mask: &RowMask,
    first_row: usize,
    rows: usize,
    stats: &mut GpuStats,
) -> Result<cudarc::driver::CudaSlice<u32>> {
    // The mask's own bits (1.4 MB for 11M rows), word for word.
    let passing = mask.words(first_row, rows);
    let bits = if part.all_valid {
        passing
    } else {
        let mut valid = download(device, &part.valid_bits, passing.len())?;
        for (v, p) in valid.iter_mut().zip(&passing) {
            *v &= p;
        }
        valid
    };
    upload(device, &bits, stats)
}
