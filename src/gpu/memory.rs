//! Moving buffers between the host and a device, on the stream of the device's lane.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, ValidAsZeroBits};
use datafusion::common::Result;
use rayon::prelude::*;

use super::args::DevPtr;
use super::device::{cuda_err, stage_bytes, Device, StagingGuard};
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
    if std::mem::size_of_val(data) >= stage_bytes() {
        match device.staging() {
            Ok(staging) => return upload_staged(device, staging, data),
            // (pinned memory refused: the driver's own path still works)
            Err(e) => log::debug!("GPU {}: no staging buffers: {e}", device.ordinal),
        }
    }
    device
        .stream
        .clone_htod(data)
        .map_err(cuda_err("copying to the device"))
}

/// [`upload`] of a large buffer through the lane's two pinned staging buffers: the cores fill
/// one while the other is copied, where a copy from pageable memory ran at 4-5 GB/s through the
/// driver's own staging (the right side's upload, 303 MB at the movielens shape, took 63 ms).
fn upload_staged<T: DeviceRepr>(
    device: &Device,
    mut staging: StagingGuard<'_>,
    data: &[T],
) -> Result<CudaSlice<T>> {
    // SAFETY: every byte is written by the copies below, which the stream runs before anything
    // later on it reads the buffer.
    let dst = unsafe { device.stream.alloc::<T>(data.len()) }
        .map_err(cuda_err("allocating device memory"))?;
    let base = addr(device, &dst);
    // SAFETY: `T: DeviceRepr` is plain data, read here as its bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
    };
    let chunk_bytes = staging.chunk_bytes();
    let (started, mut waiting) = (Instant::now(), Duration::ZERO);
    for (i, chunk) in bytes.chunks(chunk_bytes).enumerate() {
        let (buffer, copied) = staging.buffer(i % 2);
        // The buffer's last copy is done before it is filled again.
        let wait = Instant::now();
        copied
            .synchronize()
            .map_err(cuda_err("copying to the device"))?;
        waiting += wait.elapsed();
        let target = &mut buffer
            .as_mut_slice()
            .map_err(cuda_err("copying to the device"))?[..chunk.len()];
        fill_pool().install(|| {
            target
                .par_chunks_mut(1 << 20)
                .zip(chunk.par_chunks(1 << 20))
                .for_each(|(to, from)| to.copy_from_slice(from))
        });
        // SAFETY: the destination range lies inside `dst` (allocated on this stream); the source
        // is pinned and not written again before `copied` says this copy is done.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                base + (i * chunk_bytes) as u64,
                &*target,
                device.stream.cu_stream(),
            )
        }
        .map_err(cuda_err("copying to the device"))?;
        copied
            .record(&device.stream)
            .map_err(cuda_err("copying to the device"))?;
    }
    if bytes.len() >= 1 << 30 {
        log::debug!(
            "GPU {}: {} bytes staged in {:?} ({waiting:?} of it waiting for the copies)",
            device.ordinal,
            bytes.len(),
            started.elapsed()
        );
    }
    Ok(dst)
}

/// `rows` rows of `columns` values, contiguous on the device from `src`'s start, into `dst`, its
/// rows `stride` apart (the values between them are left as they are). A large block goes
/// through the lane's two pinned staging buffers, each copied out by the cores while the device
/// fills the other: a copy into pageable memory goes through the driver's own staging on one
/// thread, and the pages of a fresh destination (a distance matrix, hundreds of MB) are faulted
/// in by that thread too. `pieces`: staged whatever the size, in pieces of at most this many
/// bytes (tests: many pieces of a small block).
pub(crate) fn download_rows<T: DeviceRepr + Copy + Send + Sync>(
    device: &Device,
    src: &CudaSlice<T>,
    (rows, columns): (usize, usize),
    (dst, stride): (&mut [T], usize),
    pieces: Option<usize>,
) -> Result<()> {
    let total = rows * columns;
    if total == 0 {
        return Ok(());
    }
    assert!(src.len() >= total && stride >= columns && dst.len() >= (rows - 1) * stride + columns);
    let size = std::mem::size_of::<T>();
    if pieces.is_some() || total * size >= stage_bytes() {
        match device.staging() {
            Ok(staging) => {
                let shape = Shape {
                    total,
                    columns,
                    stride,
                    piece_bytes: pieces.unwrap_or(usize::MAX),
                };
                return download_staged(device, staging, src, shape, dst);
            }
            Err(e) => log::debug!("GPU {}: no staging buffers: {e}", device.ordinal),
        }
    }
    if stride == columns {
        device
            .stream
            .memcpy_dtoh(&src.slice(0..total), &mut dst[..total])
            .map_err(cuda_err("copying from the device"))?;
    } else {
        let block = download(device, src, total)?;
        scatter_rows(&block, 0, columns, dst, stride);
    }
    device
        .stream
        .synchronize()
        .map_err(cuda_err("copying from the device"))
}

/// What [`download_staged`] copies: `total` values of rows of `columns`, into rows `stride`
/// apart, in pieces of at most `piece_bytes` (and of the staging buffers' size).
struct Shape {
    total: usize,
    columns: usize,
    stride: usize,
    piece_bytes: usize,
}

/// [`download_rows`] through the staging buffers: piece i + 1 is copied into one buffer while
/// the cores copy piece i out of the other.
fn download_staged<T: DeviceRepr + Copy + Send + Sync>(
    device: &Device,
    mut staging: StagingGuard<'_>,
    src: &CudaSlice<T>,
    shape: Shape,
    dst: &mut [T],
) -> Result<()> {
    let Shape {
        total,
        columns,
        stride,
        piece_bytes,
    } = shape;
    let size = std::mem::size_of::<T>();
    let piece = (staging.chunk_bytes().min(piece_bytes) / size).max(1);
    let pieces = total.div_ceil(piece);
    let base = addr(device, src);
    let range = |i: usize| i * piece..((i + 1) * piece).min(total);
    let issue = |staging: &mut StagingGuard<'_>, i: usize| -> Result<()> {
        let (buffer, copied) = staging.buffer(i % 2);
        let values = range(i);
        let target = &mut buffer
            .as_mut_slice()
            .map_err(cuda_err("copying from the device"))?[..values.len() * size];
        // SAFETY: the source range lies inside `src` (on this stream); the pinned target is not
        // read before `copied` says this copy is done, nor written by another copy before the
        // cores have copied its last piece out (the loop below waits for that first).
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                target,
                base + (values.start * size) as u64,
                device.stream.cu_stream(),
            )
        }
        .map_err(cuda_err("copying from the device"))?;
        copied
            .record(&device.stream)
            .map_err(cuda_err("copying from the device"))
    };
    issue(&mut staging, 0)?;
    for i in 0..pieces {
        if i + 1 < pieces {
            issue(&mut staging, i + 1)?;
        }
        let (buffer, copied) = staging.buffer(i % 2);
        copied
            .synchronize()
            .map_err(cuda_err("copying from the device"))?;
        let values = range(i);
        let bytes = buffer
            .as_slice()
            .map_err(cuda_err("copying from the device"))?;
        // SAFETY: the buffer (page-aligned pinned memory) holds the piece's values as the device
        // had them, `T: DeviceRepr` plain data.
        let piece: &[T] =
            unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), values.len()) };
        if stride == columns {
            fill_pool().install(|| {
                dst[values.clone()]
                    .par_chunks_mut(1 << 17)
                    .zip(piece.par_chunks(1 << 17))
                    .for_each(|(to, from)| to.copy_from_slice(from))
            });
        } else {
            scatter_rows(piece, values.start, columns, dst, stride);
        }
    }
    Ok(())
}

/// Values `first..first + block.len()` of a block of rows of `columns` values each, into `dst`
/// with its rows `stride` apart.
fn scatter_rows<T: Copy>(block: &[T], first: usize, columns: usize, dst: &mut [T], stride: usize) {
    let end = first + block.len();
    let mut at = first;
    while at < end {
        let (row, column) = (at / columns, at % columns);
        let take = (columns - column).min(end - at);
        let to = row * stride + column;
        dst[to..to + take].copy_from_slice(&block[at - first..at - first + take]);
        at += take;
    }
}

/// The threads that fill the staging buffers: their own pool, so that a large upload keeps
/// going while the global pool's cores prepare the rest of the right side (a fill queued behind
/// that work waited for all of it).
fn fill_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 8));
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("sparse-knn-stage-{i}"))
            .build()
            .expect("a thread pool for the staging copies")
    })
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
