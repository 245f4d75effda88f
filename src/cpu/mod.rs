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
mod keep;
mod minkowski;
mod persist;
mod probe;
mod ranges;
mod self_nearest;
mod union;
mod vectors;

use std::time::Instant;

use datafusion::common::{exec_err, Result};

pub use crate::join::{PairList, ProbeOptions, Selection};
pub use dense_block::{dense_block, dense_block_symmetric, fills_dense_block};
pub use index::CpuIndex;
use keep::masked_valid;
#[cfg(test)]
use probe::probe_parts_with;
pub use probe::{probe, probe_parts};
pub use self_nearest::{self_nearest, self_nearest_is_exact};
use vectors::Vectors;

use crate::join::{
    matrix_by_probe, Backend, Cancel, JoinIndex, MatrixOut, MatrixRows, Probed, RowMask,
};
use crate::metric::{Metric, MetricKind};
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
        self.probe_valid(left, selection, options, cancel, &self.valid)
    }

    /// The failing rows are dropped inside the probe, as NULL rows are: the valid flags less
    /// the mask's, made once a probe (a pass over the right rows, 1 byte each).
    fn probe_masked(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        mask: &RowMask,
        cancel: &Cancel,
    ) -> Result<Probed> {
        if mask.len() != self.rows {
            return exec_err!(
                "a row mask of {} rows for an index of {} rows",
                mask.len(),
                self.rows
            );
        }
        let valid = masked_valid(&self.valid, mask);
        self.probe_valid(left, selection, options, cancel, &valid)
    }

    fn memory_size(&self) -> usize {
        CpuIndex::memory_size(self) + self.workspace_size() * rayon::current_num_threads()
    }

    /// The folded metrics' dense blocks (`dense_block.rs`), each pair once for the index's own
    /// rows under a symmetric metric (all but kl_divergence); the others by the default probe.
    fn distance_matrix(
        &self,
        metric: &Metric,
        left: MatrixRows<'_>,
        out: MatrixOut<'_>,
    ) -> Result<()> {
        if !self.fills_dense_block() {
            return matrix_by_probe(self, metric, left.rows(), out);
        }
        out.check(left.rows().len())?;
        match left {
            MatrixRows::Own(rows) if metric.kind != MetricKind::KlDivergence => {
                dense_block_symmetric(self, rows, out.values, out.stride)
            }
            _ => dense_block(self, left.rows(), out.values, out.stride),
        }
    }

    fn self_nearest(
        &self,
        metric: &Metric,
        rows: &SparseBatch,
        k: usize,
        out: (&mut [f64], &mut [i64]),
    ) -> Result<bool> {
        self_nearest(self, rows, metric, k, out)
    }
}

impl CpuIndex {
    fn probe_valid(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        valid: &[bool],
    ) -> Result<Probed> {
        let started = Instant::now();
        let vectors = Vectors::chosen();
        let parts = self
            .kernels
            .probe(self, left, selection, options, cancel, vectors, valid);
        cancel.check()?;
        Ok(Probed {
            parts,
            compute_time: started.elapsed(),
            bytes_to_device: 0,
            gpu_times: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests;
