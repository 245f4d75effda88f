//! One probe: a slice of left rows converted and probed on the blocking pool, its counters
//! (pairs, kernel time, bytes to the device, per-GPU kernel time) and its pairs' memory.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, Time,
};

use super::Probing;
use crate::join::{max_chunk_nnz, Cancel, GroupedProbe, PairList, ProbeOptions, Probed};
use crate::planner::spec::{JoinSpec, Layout};
use crate::vector::SparseBatch;

/// Per output partition: probes each left batch and assembles the output batch.
#[derive(Clone)]
pub(super) struct ProbeJob {
    pub(super) spec: Arc<JoinSpec>,
    pub(super) cancel: Cancel,
    /// The pairs of the slice being probed and its output, in the session's memory pool.
    pub(super) reservation: Arc<MemoryReservation>,
    /// `exclude_self=COLUMN`'s column in the left input.
    pub(super) left_key: Option<usize>,
    /// `within=COLUMN`'s column in the left input.
    pub(super) left_within: Option<usize>,
    pub(super) layout: Layout,
    pub(super) left_vector: String,
    pub(super) schema: SchemaRef,
    pub(super) baseline: BaselineMetrics,
    pub(super) pairs: Count,
    pub(super) kernel_time: Time,
    pub(super) bytes_to_device: Count,
    /// `kernel_time_gpu<N>` per GPU that worked for this partition, registered on first use.
    pub(super) gpu_kernel_times: Arc<Mutex<Vec<(usize, Time)>>>,
    pub(super) metrics: ExecutionPlanMetricsSet,
    pub(super) partition: usize,
}

impl ProbeJob {
    fn gpu_time(&self, ordinal: usize) -> Time {
        let mut times = self
            .gpu_kernel_times
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = times.iter().find(|(o, _)| *o == ordinal) {
            return t.clone();
        }
        let t = MetricBuilder::new(&self.metrics)
            .subset_time(format!("kernel_time_gpu{ordinal}"), self.partition);
        times.push((ordinal, t.clone()));
        t
    }

    pub(super) async fn run(
        &self,
        build: Arc<Probing>,
        batch: RecordBatch,
        first_row: u64,
        exclude_self: bool,
    ) -> Result<Vec<RecordBatch>> {
        let spec = Arc::clone(&self.spec);
        let vectors = batch.column(self.layout.left_vector).clone();
        let left_keys = self.left_key.map(|i| batch.column(i).clone());
        let left_within = self.left_within.map(|i| batch.column(i).clone());
        let column = self.left_vector.clone();
        let probe_build = Arc::clone(&build);
        let cancel = self.cancel.clone();
        let started = Instant::now();
        let Probed {
            parts,
            compute_time: kernel,
            bytes_to_device: bytes,
            gpu_times,
        } = SpawnedTask::spawn_blocking(move || -> Result<Probed> {
            let check = spec.vector_check(&column).with_first_row(first_row);
            // One piece unless the batch holds more entries than 32-bit offsets address.
            let pieces =
                SparseBatch::try_from_array_chunked(vectors.as_ref(), &check, max_chunk_nnz())?;
            let groups = probe_build.key_groups.as_ref().zip(left_keys);
            let selection = match &groups {
                Some((groups, _)) => groups.widen(spec.kind.selection()),
                None => spec.kind.selection(),
            };
            let within = match (&probe_build.within, left_within) {
                (Some(members), Some(keys)) => Some((members, members.left_groups(&keys)?)),
                _ => None,
            };
            let mut probed = Probed::default();
            let mut offset = 0usize;
            for left in &pieces {
                let options = ProbeOptions {
                    exclude_self_from: exclude_self.then_some((first_row + offset as u64) as i64),
                };
                let index = &probe_build.index;
                let mut piece = match (&within, &probe_build.mask) {
                    (Some((members, groups)), mask) => index.probe_grouped(
                        left,
                        GroupedProbe::new(
                            &groups[offset..offset + left.len()],
                            members,
                            mask.as_ref(),
                        ),
                        selection,
                        options,
                        &cancel,
                    )?,
                    (None, Some(mask)) => {
                        index.probe_masked(left, selection, options, mask, &cancel)?
                    }
                    (None, None) => index.probe_cancellable(left, selection, options, &cancel)?,
                };
                for part in &mut piece.parts {
                    for l in part.left.iter_mut() {
                        *l += offset as u32;
                    }
                }
                let parts = probed.absorb(piece);
                probed.parts.extend(parts);
                offset += left.len();
            }
            if let Some((groups, keys)) = groups {
                // Each part holds whole left rows, which is all the filter looks at.
                let left_groups = groups.left_groups(&keys)?;
                let selection = spec.kind.selection();
                probed.parts = std::mem::take(&mut probed.parts)
                    .into_iter()
                    .map(|part| groups.filter(part, &left_groups, selection))
                    .collect();
            }
            Ok(probed)
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))??;
        log::debug!(
            "{}: probed left rows {first_row}..{} in {:?} (kernels {kernel:?})",
            self.spec.function_name(),
            first_row + batch.num_rows() as u64,
            started.elapsed()
        );
        self.kernel_time.add_duration(kernel);
        self.bytes_to_device.add(bytes as usize);
        for (ordinal, time) in gpu_times {
            self.gpu_time(ordinal).add_duration(time);
        }
        // This probe's own share of the partition's reservation (probes overlap), freed when
        // the batch becomes the consumer's.
        let reservation = self.reservation.new_empty();
        let held = parts.iter().map(PairList::len).sum::<usize>() * 16;
        self.reserve(&reservation, held, batch.num_rows())?;

        let _timer = self.baseline.elapsed_compute().timer();
        // A record batch per part: the parts are handed on without being copied into one.
        let out = parts
            .into_iter()
            .map(|part| self.assemble(&build, &batch, part))
            .collect::<Result<Vec<_>>>()?;
        let (rows, bytes) = out.iter().fold((0, 0), |(r, b), o| {
            (r + o.num_rows(), b + o.get_array_memory_size())
        });
        self.reserve(&reservation, held + bytes, batch.num_rows())?;
        self.pairs.add(rows);
        Ok(out)
    }

    fn reserve(&self, reservation: &MemoryReservation, bytes: usize, rows: usize) -> Result<()> {
        reservation.try_resize(bytes).map_err(|e| {
            let reason = match e {
                DataFusionError::ResourcesExhausted(m) => m,
                e => e.to_string(),
            };
            DataFusionError::ResourcesExhausted(format!(
                "{}: the pairs of {rows} left rows need {bytes} bytes of session memory: \
                 {reason}; raise the memory limit, or ask for fewer pairs (a smaller k or radius)",
                self.spec.function_name()
            ))
        })
    }
}
