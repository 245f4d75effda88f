//! The one interface between the planner's operators and a backend.

use std::time::Duration;

use datafusion::common::Result;

use super::cancel::Cancel;
use super::pairs::PairList;
use super::selection::{ProbeOptions, Selection};
use crate::metric::Metric;
use crate::vector::SparseBatch;

/// What one probe returned, with the counters EXPLAIN ANALYZE shows.
#[derive(Debug, Default)]
pub struct Probed {
    pub pairs: PairList,
    /// Time spent computing (kernel time on a GPU, wall time of the probe on the CPU).
    pub compute_time: Duration,
    /// Bytes copied to a device for this probe (0 on the CPU).
    pub bytes_to_device: u64,
}

/// The right side of a join, built once by a backend and probed by every left batch, possibly
/// from several threads at once.
pub trait JoinIndex: Send + Sync {
    /// The pairs of `left` against the whole right side.
    fn probe(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
    ) -> Result<Probed> {
        self.probe_cancellable(left, selection, options, &Cancel::new())
    }

    /// [`JoinIndex::probe`], giving up with an error soon after `cancel` is set.
    fn probe_cancellable(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed>;

    /// Host memory held by the index while it lives, including per-thread probe workspace.
    fn memory_size(&self) -> usize;

    /// Bytes the build copied to a device (0 on the CPU).
    fn build_bytes_to_device(&self) -> u64 {
        0
    }
}

/// A place joins run (the CPU cores, the GPUs): builds the right side's index.
pub trait Backend: Send + Sync {
    /// A short name for EXPLAIN and logs ("cpu", "gpu").
    fn name(&self) -> &'static str;

    /// The index of `right` for `metric`; errors say what went wrong (no device, no memory).
    fn build(&self, right: &SparseBatch, metric: &Metric) -> Result<Box<dyn JoinIndex>>;
}
