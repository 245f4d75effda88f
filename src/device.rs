//! Where a join runs once the `device` option is resolved against the machine: the CPU cores
//! or the GPUs. Above both backends, below the planner and the kept index, which choose one.

use std::fmt;

use datafusion::common::{plan_err, Result};

use crate::options::DeviceChoice;

/// Where a planned operator runs, once `auto` is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Gpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}

/// Resolves the `device` option against the machine.
pub fn resolve_device(function: &str, choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        // Only whether a CUDA driver can be loaded: initialising it and opening the contexts
        // (0.1-0.5 s on the machines measured, more with more GPUs) is the join's warm-up,
        // while its right side is read; a driver without a usable device fails the build with
        // the driver's reason.
        DeviceChoice::Gpu if crate::gpu::has_driver() => Ok(Device::Gpu),
        DeviceChoice::Gpu => plan_err!(
            "{function}: device=gpu but no CUDA GPU was found: {}; use device=cpu, or device=auto \
             to fall back to the CPU",
            crate::gpu::describe()
        ),
        DeviceChoice::Auto => {
            let device = match crate::gpu::auto_fallback_reason() {
                None => Device::Gpu,
                Some(reason) => {
                    log::info!("{function}: device=auto runs on the CPU: {reason}");
                    Device::Cpu
                }
            };
            Ok(device)
        }
    }
}
