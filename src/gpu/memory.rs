//! Moving buffers between the host and a device, on the device's one stream.

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, ValidAsZeroBits};
use datafusion::common::Result;

use super::args::DevPtr;
use super::device::{cuda_err, Device};
use super::stats::GpuStats;

/// Copies `data` to the device, counting the bytes.
pub(crate) fn upload<T: DeviceRepr>(
    device: &Device,
    data: &[T],
    stats: &mut GpuStats,
) -> Result<CudaSlice<T>> {
    stats.bytes_to_device += std::mem::size_of_val(data) as u64;
    if data.is_empty() {
        // A zero-byte allocation is an error in the driver: keep one (never read) element.
        // SAFETY: the element is never read by a kernel (lengths say the buffer is empty).
        return unsafe { device.stream.alloc::<T>(1) }
            .map_err(cuda_err("allocating device memory"));
    }
    device
        .stream
        .clone_htod(data)
        .map_err(cuda_err("copying to the device"))
}

/// `n` zeroed elements on the device (at least one: see [`upload`]).
pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    device: &Device,
    n: usize,
) -> Result<CudaSlice<T>> {
    device
        .stream
        .alloc_zeros::<T>(n.max(1))
        .map_err(cuda_err("allocating device memory"))
}

/// The first `n` elements of `src`, copied to the host.
pub(crate) fn download<T: DeviceRepr>(
    device: &Device,
    src: &CudaSlice<T>,
    n: usize,
) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut v = device
        .stream
        .clone_dtoh(&src.slice(0..n))
        .map_err(cuda_err("copying from the device"))?;
    v.truncate(n);
    Ok(v)
}

/// The address of a buffer, for a kernel argument struct. Every buffer of this crate lives on
/// its device's one stream (event tracking is off, see `device::open`), so no synchronisation
/// is attached to the address.
pub(crate) fn addr<T>(device: &Device, buffer: &CudaSlice<T>) -> DevPtr {
    buffer.device_ptr(&device.stream).0
}
