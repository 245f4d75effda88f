//! The CUDA backend (work in progress: this is the interface the planner uses).

use datafusion::common::{exec_err, Result};

use crate::cpu::{PairList, ProbeOptions, Selection};
use crate::metric::Metric;
use crate::vector::SparseBatch;

/// Settings of one GPU join.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Device memory the operator may use, in bytes (None: the device's free memory).
    pub memory_limit: Option<u64>,
}

/// Counters an operator reports in EXPLAIN ANALYZE.
#[derive(Debug, Clone, Default)]
pub struct GpuStats {
    pub bytes_to_device: u64,
    pub kernel_nanos: u64,
    pub peak_device_bytes: u64,
}

/// Whether a CUDA driver and at least one device can be used.
pub fn is_available() -> bool {
    false
}

/// The right side of a join, resident on the device.
#[derive(Debug)]
pub struct GpuIndex {}

impl GpuIndex {
    pub fn build(_right: &SparseBatch, _metric: &Metric, _options: &GpuOptions) -> Result<Self> {
        exec_err!("device=gpu: no CUDA GPU backend in this build")
    }

    pub fn probe(&self, _left: &SparseBatch, _selection: Selection, _options: ProbeOptions) -> Result<PairList> {
        exec_err!("device=gpu: no CUDA GPU backend in this build")
    }

    pub fn stats(&self) -> GpuStats {
        GpuStats::default()
    }
}

/// Totals over every GPU operator of this process since the last reset (for `sparse-knn bench`).
pub fn process_stats() -> GpuStats {
    GpuStats::default()
}

pub fn reset_process_stats() {}
