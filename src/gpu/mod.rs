//! The CUDA backend: the generic semiring kernels of `kernels/`, instantiated per metric with the
//! CUDA generated from `src/metric`, compiled at run time with NVRTC for the device's own
//! architecture.
//!
//! - `device`: discovery, one context and stream per device, the modules compiled per metric;
//! - `memory`: uploads and downloads; `prepare`: the right side as the kernels read it;
//! - `args`: the kernels' parameter structs (their CUDA twins are generated); `launch`: one
//!   launch, from arguments to pairs; `index`: building the right side, chunking the probes.
//!
//! Everything goes through cudarc with dynamic loading: a build needs no CUDA, and a machine
//! without a driver or a device answers `is_available() == false` and a clear error from
//! `GpuIndex::build`.

mod args;
mod device;
mod index;
pub mod kernels;
mod launch;
mod memory;
mod prepare;
mod stats;

use std::time::Duration;

use datafusion::common::Result;

pub use index::GpuIndex;
pub use stats::{process_stats, reset_process_stats, GpuOptions, GpuStats};

use crate::join::{Backend, Cancel, JoinIndex, ProbeOptions, Probed, Selection};
use crate::metric::{Metric, Semiring};
use crate::vector::SparseBatch;

/// Whether a CUDA driver and at least one device can be used.
pub fn is_available() -> bool {
    device::device(0).is_ok()
}

/// Why `device=auto` does not run on the GPU (no driver, no device, no NVRTC to compile the
/// kernels), or None when it does.
pub fn auto_fallback_reason() -> Option<String> {
    if let Err(e) = device::device(0) {
        return Some(e.to_string());
    }
    if !kernels::nvrtc_available() {
        return Some(
            "NVRTC (libnvrtc.so) cannot be loaded, so the kernels cannot be compiled".into(),
        );
    }
    None
}

/// A one-line description of the device that `GpuIndex::build` uses (for EXPLAIN and the CLI),
/// or the reason there is none.
pub fn describe() -> String {
    match device::device(0) {
        Ok(d) => format!("{d:?}"),
        Err(e) => e.to_string(),
    }
}

impl GpuIndex {
    /// Prepares `right` and uploads it to the first GPU. Errors (no driver, no device, kernels
    /// that fail to compile, not enough memory) say what went wrong.
    pub fn build(right: &SparseBatch, metric: &Metric, options: &GpuOptions) -> Result<Self> {
        crate::with_semiring!(metric, s => Self::build_with(right, &s, options))
    }

    /// [`GpuIndex::build`] for any metric definition, including one defined outside the crate.
    pub fn build_with<S: Semiring>(
        right: &SparseBatch,
        s: &S,
        options: &GpuOptions,
    ) -> Result<Self> {
        let device = device::device(0)?;
        Self::build_on(device, right, s, options)
    }
}

/// Joins on a CUDA GPU.
#[derive(Debug, Clone, Default)]
pub struct GpuBackend {
    pub options: GpuOptions,
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn build(&self, right: &SparseBatch, metric: &Metric) -> Result<Box<dyn JoinIndex>> {
        Ok(Box::new(GpuIndex::build(right, metric, &self.options)?))
    }
}

impl JoinIndex for GpuIndex {
    fn probe_cancellable(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed> {
        let (pairs, stats) = self.probe_counted(left, selection, options, cancel)?;
        Ok(Probed {
            pairs,
            compute_time: Duration::from_nanos(stats.kernel_nanos),
            bytes_to_device: stats.bytes_to_device,
        })
    }

    fn memory_size(&self) -> usize {
        // The right side lives on the device; the host keeps it only when streamed in parts.
        self.host_bytes()
    }

    fn build_bytes_to_device(&self) -> u64 {
        self.stats().bytes_to_device
    }
}
