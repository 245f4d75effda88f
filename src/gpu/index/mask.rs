//! A filter's predicate over the kept side's other columns, run where the index lives: the
//! program of `join::MaskProgram` in one kernel (`mask_program` in kernels/mask.cu), a row a
//! thread, over the columns it reads, uploaded by the first filter that reads them and kept with
//! the index (88 MB for an Int64 column of 11M rows). A new filter then costs one launch and the
//! mask's copy back (1.4 MB for 11M rows), where DataFusion's kernels on the host took 5.8-8.1 ms
//! of 16 cores for `(id + r) % m = c`.

use std::collections::HashMap;

use arrow::array::RecordBatch;
use arrow::buffer::BooleanBuffer;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use datafusion::common::{exec_datafusion_err, exec_err, Result};

use super::GpuIndex;
use crate::gpu::args::MaskArgs;
use crate::gpu::device::cuda_err;
use crate::gpu::memory::{addr, download, upload};
use crate::gpu::stats::GpuStats;
use crate::join::bits_from_words;
use crate::join::mask_program::{ColumnSlot, MaskProgram};

/// Free device memory a column's upload leaves at least (the probes' scratch).
const MASK_HEADROOM: u64 = 1 << 30;

/// Threads a block of the kernel (its `__launch_bounds__`).
const MASK_THREADS: u32 = 256;

/// A kept column on the device: a key a row and, where the column has NULLs, a bit a row.
pub(super) struct DevColumn {
    keys: CudaSlice<i64>,
    valid: Option<CudaSlice<u32>>,
}

/// Columns by their place among the kept side's other columns (and the type cast to).
pub(super) type MaskColumns = HashMap<ColumnSlot, DevColumn>;

impl GpuIndex {
    /// The rows of `columns` (the side's other columns, a row for each row of this index) that
    /// `program` passes; None where a column it reads does not fit beside the index (the host
    /// evaluates the predicate instead).
    pub(crate) fn mask_on_device(
        &self,
        program: &MaskProgram,
        columns: &RecordBatch,
    ) -> Result<Option<BooleanBuffer>> {
        if columns.num_rows() != self.rows {
            return exec_err!(
                "GPU: a filter over {} rows for an index of {} rows",
                columns.num_rows(),
                self.rows
            );
        }
        if self.rows == 0 {
            return Ok(Some(BooleanBuffer::new_unset(0)));
        }
        self.with_device(|_, lanes| {
            let device = lanes.device();
            let mut stats = GpuStats::default();
            let mut held = self
                .mask_columns
                .lock()
                .map_err(|_| exec_datafusion_err!("GPU: a filter's upload panicked"))?;
            let mut uploaded = false;
            for slot in program.columns() {
                if held.contains_key(slot) {
                    continue;
                }
                let Some(keys) = slot.keys(columns) else {
                    return Ok(None);
                };
                let (free, _) = device.memory()?;
                if free < keys.bytes() as u64 + MASK_HEADROOM {
                    log::debug!(
                        "GPU {}: a filter's column of {} bytes does not fit ({free} free): \
                         evaluated on the host",
                        device.ordinal,
                        keys.bytes()
                    );
                    return Ok(None);
                }
                let on_device = DevColumn {
                    keys: upload(device, &keys.keys, &mut stats)?,
                    valid: match &keys.valid {
                        Some(bits) => Some(upload(device, bits, &mut stats)?),
                        None => None,
                    },
                };
                held.insert(slot.clone(), on_device);
                uploaded = true;
            }
            if uploaded {
                // Later filters read them from other lanes' streams.
                device
                    .stream
                    .synchronize()
                    .map_err(cuda_err("uploading a filter's columns"))?;
                log::debug!(
                    "GPU {}: {} bytes of kept columns uploaded for filters",
                    device.ordinal,
                    stats.bytes_to_device
                );
            }
            let slots: Vec<&DevColumn> = program.columns().iter().map(|c| &held[c]).collect();
            let values: Vec<u64> = slots.iter().map(|c| addr(device, &c.keys)).collect();
            let valid: Vec<u64> = slots
                .iter()
                .map(|c| c.valid.as_ref().map_or(0, |v| addr(device, v)))
                .collect();
            let ops = upload(device, &program.ops(), &mut stats)?;
            let values = upload(device, &values, &mut stats)?;
            let valid = upload(device, &valid, &mut stats)?;
            let n_words = self.rows.div_ceil(32);
            // SAFETY: every word is written by the kernel (a warp per 32 rows) before it is read.
            let words = unsafe { device.stream.alloc::<u32>(n_words) }
                .map_err(cuda_err("allocating device memory"))?;
            let args = MaskArgs {
                ops: addr(device, &ops),
                n_ops: program.len() as i32,
                n_columns: slots.len() as i32,
                values: addr(device, &values),
                valid: addr(device, &valid),
                rows: self.rows as i64,
                words: addr(device, &words),
            };
            let f = device.function(&self.program, "mask_program", 0)?;
            let cfg = LaunchConfig {
                grid_dim: (self.rows.div_ceil(MASK_THREADS as usize) as u32, 1, 1),
                block_dim: (MASK_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = device.stream.launch_builder(&f);
            b.arg(&args);
            // SAFETY: `MaskArgs` is the kernel's one parameter (its CUDA declaration generated
            // from the Rust struct); the program was compiled with its stack bound and reads
            // only slots below `n_columns`, each a column of `rows` keys (and rows.div_ceil(32)
            // validity words); `words` holds rows.div_ceil(32) words; the buffers outlive the
            // launch (the copy below waits for it).
            unsafe { b.launch(cfg) }.map_err(cuda_err("launching the filter's kernel"))?;
            let words = download(device, &words, n_words)?;
            Ok(Some(bits_from_words(words, self.rows)))
        })
    }
}
