//! The CPU backend: an inverted index of the build side and a parallel probe with fused top-k,
//! generic over the metric definitions of `src/metric`.

mod certified;
mod chebyshev;
mod dense_block;
mod dense_codes;
mod folded;
mod index;
mod int_tiles;
mod js_filter;
mod minkowski;
mod persist;
mod probe;
mod ranges;
mod self_nearest;
mod union;
mod vectors;

use std::time::Instant;

use datafusion::common::Result;

pub use crate::join::{PairList, ProbeOptions, Selection};
pub use dense_block::{dense_block, dense_block_symmetric, fills_dense_block};
pub use index::CpuIndex;
#[cfg(test)]
use probe::probe_parts_with;
pub use probe::{probe, probe_parts};
pub use self_nearest::{self_nearest, self_nearest_is_exact};
use vectors::Vectors;

use crate::join::{Backend, Cancel, JoinIndex, Probed};
use crate::metric::Metric;
use crate::vector::SparseBatch;

/// Joins on all CPU cores.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn build(&self, right: &SparseBatch, metric: &Metric) -> Result<Box<dyn JoinIndex>> {
        Ok(Box::new(CpuIndex::build(right, metric)))
    }
}

impl JoinIndex for CpuIndex {
    fn probe_cancellable(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed> {
        let started = Instant::now();
        let parts = self
            .kernels
            .probe(self, left, selection, options, cancel, Vectors::chosen());
        cancel.check()?;
        Ok(Probed {
            parts,
            compute_time: started.elapsed(),
            bytes_to_device: 0,
            gpu_times: Vec::new(),
        })
    }

    fn memory_size(&self) -> usize {
        CpuIndex::memory_size(self) + self.workspace_size() * rayon::current_num_threads()
    }
}

#[cfg(test)]
mod tests;
