//! A prepared part moved to the device: its buffers uploaded, its inverted lists built there when
//! the host left them for the device (`lists`), and its dense block filled.

use datafusion::common::Result;

use super::super::device::Device;
use super::super::kernels::MetricProgram;
use super::super::lists::ListSource;
use super::super::memory::upload;
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
    if host.dense_kp > 0 {
        part.dense = Some(fill_dense(device, program, host, &part, stats)?);
    }
    Ok(part)
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
        y_min: host.y_min,
        y_max: host.y_max,
        bytes: host.device_bytes(),
        dense: None,
    })
}
