//! A prepared part moved to the device: its buffers uploaded, its inverted lists built there when
//! the host left them for the device (`lists`), and its dense block filled.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use datafusion::common::Result;

use super::super::device::{cuda_err, Device};
use super::super::kernels::MetricProgram;
use super::super::lists::ListSource;
use super::super::memory::{addr, upload, zeros};
use super::super::stats::GpuStats;
use super::*;

/// `host` on the device; a part that left its inverted lists for the device
/// ([`HostPart::device_lists`]) builds them there from `source`.
pub(crate) fn upload_part(
    device: &Device,
    program: &MetricProgram,
    host: &HostPart,
    source: Option<&ListSource<'_>>,
    stats: &mut GpuStats,
) -> Result<DevPart> {
    let mut part = upload_lists(device, host, stats)?;
    if host.device_lists.is_some() {
        let source = source.expect("the rows of a part whose lists are built on the device");
        let started = std::time::Instant::now();
        let built = super::super::lists::build(device, program, host, &part, source, stats)?;
        (part.tile_ptr, part.col_entries) = (built.tile_ptr, built.col_entries);
        if let Some(ranks) = built.col_ranks {
            part.col_ranks = ranks;
        }
        log::debug!(
            "GPU {}: inverted lists built on the device in {:?}",
            device.ordinal,
            started.elapsed()
        );
    }
    if host.entry_lifts {
        part.col_lift = entry_lifts(device, program, host, &part)?;
    }
    if host.dense_kp > 0 {
        part.dense = Some(fill_dense(device, program, host, &part, stats)?);
    }
    Ok(part)
}

/// Each list entry's lift, computed on the device from the entries in place (`entry_lifts` in
/// kernels/knn.cu: the very `lift` the pairs read, so their bits are those of computing it per
/// pair).
fn entry_lifts(
    device: &Device,
    program: &MetricProgram,
    host: &HostPart,
    part: &DevPart,
) -> Result<CudaSlice<f64>> {
    let n = host.entries();
    let lifts = zeros::<f64>(device, n)?;
    if n == 0 {
        return Ok(lifts);
    }
    let f = device.function(program, "entry_lifts", 0)?;
    let threads = 256u32;
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(threads as usize).min(1 << 16) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let (entries, out, count) = (
        addr(device, &part.col_entries),
        addr(device, &lifts),
        n as i64,
    );
    let (p, d) = (program.params.p, program.params.d);
    let mut b = device.stream.launch_builder(&f);
    b.arg(&entries).arg(&out).arg(&count).arg(&p).arg(&d);
    // SAFETY: the kernel's parameters are (const uint2*, double*, long long, double, double) in
    // this order; both buffers hold `n` elements (the lists' entries, built or uploaded above,
    // and the lifts just allocated) and live as long as the part. No wait here: a resident
    // part's upload is waited on before any probe (`layout.rs`), and a part streamed per probe
    // is uploaded on the stream that then runs its kernels.
    unsafe { b.launch(cfg) }.map_err(cuda_err("launching the kernel"))?;
    Ok(lifts)
}

fn upload_lists(device: &Device, host: &HostPart, stats: &mut GpuStats) -> Result<DevPart> {
    Ok(DevPart {
        valid_bits: upload(device, &host.valid_bits, stats)?,
        all_valid: host.valid_bits.is_empty(),
        rt0: upload(device, &host.rt0, stats)?,
        rt1: upload(device, &host.rt1, stats)?,
        key_base: upload(device, &host.key_base, stats)?,
        tile_ptr: upload(device, &host.tile_ptr, stats)?,
        col_entries: upload(device, &host.col_entries, stats)?,
        col_ranks: upload(device, &host.col_ranks, stats)?,
        r_top: upload(device, &host.r_top, stats)?,
        col_lift: zeros::<f64>(device, 0)?,
        y_min: host.y_min,
        y_max: host.y_max,
        bytes: host.device_bytes(),
        dense: None,
    })
}
