//! Settings of a GPU join and the counters it reports.

use std::sync::atomic::{AtomicU64, Ordering};

/// Settings of one GPU join.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Device memory the operator may use on each GPU, in bytes (None: most of the device's
    /// free memory).
    pub memory_limit: Option<u64>,
    /// The CUDA ordinals to use (None: every visible GPU).
    pub gpus: Option<Vec<usize>>,
    /// Right columns multiplied on the tensor cores (dot, cosine).
    pub dense_columns: crate::options::DenseColumnChoice,
}

/// Counters an operator reports in EXPLAIN ANALYZE.
#[derive(Debug, Clone, Default)]
pub struct GpuStats {
    /// Bytes copied from the host to the device (right side once, then every left batch).
    pub bytes_to_device: u64,
    /// Time inside kernels, measured with device events.
    pub kernel_nanos: u64,
    /// Largest device memory held at once by the index's own buffers (right side + one probe).
    pub peak_device_bytes: u64,
    /// Most groups any launch cut its tiles into (1: a block per left row walked every tile).
    pub most_tile_groups: usize,
}

static BYTES_TO_DEVICE: AtomicU64 = AtomicU64::new(0);
static KERNEL_NANOS: AtomicU64 = AtomicU64::new(0);
static PEAK_DEVICE_BYTES: AtomicU64 = AtomicU64::new(0);

pub(crate) fn record_process_stats(s: &GpuStats) {
    BYTES_TO_DEVICE.fetch_add(s.bytes_to_device, Ordering::Relaxed);
    KERNEL_NANOS.fetch_add(s.kernel_nanos, Ordering::Relaxed);
    PEAK_DEVICE_BYTES.fetch_max(s.peak_device_bytes, Ordering::Relaxed);
}

/// Totals over every GPU operator of this process since the last reset (for `sparse-knn bench`);
/// the peak is the largest of any one index.
pub fn process_stats() -> GpuStats {
    GpuStats {
        bytes_to_device: BYTES_TO_DEVICE.load(Ordering::Relaxed),
        kernel_nanos: KERNEL_NANOS.load(Ordering::Relaxed),
        peak_device_bytes: PEAK_DEVICE_BYTES.load(Ordering::Relaxed),
        most_tile_groups: 0,
    }
}

pub fn reset_process_stats() {
    BYTES_TO_DEVICE.store(0, Ordering::Relaxed);
    KERNEL_NANOS.store(0, Ordering::Relaxed);
    PEAK_DEVICE_BYTES.store(0, Ordering::Relaxed);
}
