//! The CUDA C sources of `kernels/`, embedded in the binary and compiled at run time with NVRTC.

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use datafusion::common::{exec_datafusion_err, Result};

use crate::metric::MetricKind;

/// The metric definitions first, then the kernels that use them (NVRTC sees one translation unit,
/// so no include paths are needed).
pub const KERNEL_SOURCE: &str = concat!(
    include_str!("../../kernels/semiring.cuh"),
    "\n",
    include_str!("../../kernels/knn.cu")
);

/// Threads per block of the folded kernels (a multiple of 32; the scan assumes at most 1024).
pub(crate) const FOLDED_THREADS: u32 = 512;
/// Threads per block of the chebyshev kernels.
pub(crate) const CHEBYSHEV_THREADS: u32 = 256;

/// Whether NVRTC (libnvrtc) can be loaded; cudarc panics on a missing library, so ask first.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the candidate library names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles every kernel for the virtual architecture `compute_XY` (e.g. "compute_90"); the
/// driver turns the PTX into the device's own machine code when the module is loaded.
pub fn compile(arch: &str) -> Result<Ptx> {
    if !nvrtc_available() {
        return Err(exec_datafusion_err!(
            "GPU: NVRTC (libnvrtc.so) cannot be loaded; install the CUDA runtime compiler \
             (e.g. pip's nvidia-cuda-nvrtc) and add its lib folder to LD_LIBRARY_PATH"
        ));
    }
    let opts = CompileOptions {
        options: vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
        ],
        name: Some("sparse_knn_kernels.cu".to_string()),
        ..Default::default()
    };
    compile_ptx_with_opts(KERNEL_SOURCE, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            exec_datafusion_err!(
                "GPU: NVRTC failed to compile the kernels:\n{}",
                log.to_string_lossy()
            )
        }
        other => exec_datafusion_err!("GPU: NVRTC failed: {other}"),
    })
}

/// Every entry point of the module (the nvrtc test checks each is present in the PTX).
pub fn kernel_names() -> Vec<String> {
    let mut names = vec!["chebyshev_knn".to_string(), "chebyshev_radius".to_string()];
    for kind in MetricKind::all().filter(|k| *k != MetricKind::Chebyshev) {
        names.push(format!("{}_knn", kernel_stem(kind)));
        names.push(format!("{}_radius", kernel_stem(kind)));
    }
    names
}

/// The name stem of a metric's kernels (its canonical name).
pub(crate) fn kernel_stem(kind: MetricKind) -> &'static str {
    kind.name()
}

/// Whether the folded kernel of `kind` accumulates in float64 (see the FOLDED list in knn.cu):
/// the right side's totals are stored in the same type.
pub(crate) fn accumulates_in_f64(kind: MetricKind) -> bool {
    matches!(
        kind,
        MetricKind::Manhattan
            | MetricKind::Minkowski
            | MetricKind::Canberra
            | MetricKind::BrayCurtis
            | MetricKind::Hellinger
            | MetricKind::JensenShannon
    )
}

/// Whether the folded kernel keeps a second accumulator per right row.
pub(crate) fn two_accumulators(kind: MetricKind) -> bool {
    matches!(kind, MetricKind::BrayCurtis | MetricKind::KlDivergence)
}
