//! Options of the join functions and `sparse_distance`: the `'key=value, ...'` string and the
//! session settings (`SET sparse_knn.device = 'gpu'`) that give their defaults.

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::ConfigExtension;
use datafusion::common::{extensions_options, plan_err, DataFusionError, Result};

use crate::metric::Metric;

extensions_options! {
    /// Session defaults for the sparse-knn functions (`SET sparse_knn.<key> = ...`).
    pub struct SparseKnnConfig {
        /// Where joins run: auto (a CUDA GPU when one is found, else the CPU), cpu or gpu.
        pub device: String, default = "auto".to_string()
        /// Minkowski degree.
        pub p: f64, default = 2.0
        /// Dimension for hamming, russellrao and correlation (0: not set).
        pub dim: u64, default = 0
        /// Skip pairs at the same row position (self-joins).
        pub exclude_self: bool, default = false
        /// Device memory a GPU join may use, e.g. '8GiB' (empty: the device's free memory).
        pub gpu_memory_limit: String, default = String::new()
    }
}

impl ConfigExtension for SparseKnnConfig {
    const PREFIX: &'static str = "sparse_knn";
}

/// Where a join runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    #[default]
    Auto,
    Cpu,
    Gpu,
}

impl FromStr for DeviceChoice {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "gpu" | "cuda" => Ok(DeviceChoice::Gpu),
            other => plan_err!("invalid device '{other}'; valid: auto, cpu, gpu"),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Gpu => "gpu",
        })
    }
}

/// Every key the options string accepts.
pub const OPTION_KEYS: &[&str] = &[
    "p",
    "dim",
    "device",
    "exclude_self",
    "left_column",
    "right_column",
    "gpu_memory_limit",
];

/// Options of one call, after session defaults and the options string are applied.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinOptions {
    pub p: Option<f64>,
    pub dim: Option<u64>,
    pub device: DeviceChoice,
    pub exclude_self: bool,
    pub left_column: Option<String>,
    pub right_column: Option<String>,
    pub gpu_memory_limit: Option<u64>,
}

impl Default for JoinOptions {
    fn default() -> Self {
        Self::from_config(&SparseKnnConfig::default()).expect("defaults are valid")
    }
}

impl JoinOptions {
    /// The session's defaults.
    pub fn from_config(config: &SparseKnnConfig) -> Result<Self> {
        Ok(Self {
            p: Some(config.p),
            dim: (config.dim > 0).then_some(config.dim),
            device: config
                .device
                .parse()
                .map_err(|e| DataFusionError::Plan(format!("setting sparse_knn.device: {e}")))?,
            exclude_self: config.exclude_self,
            left_column: None,
            right_column: None,
            gpu_memory_limit: match config.gpu_memory_limit.trim() {
                "" => None,
                s => Some(parse_bytes("sparse_knn.gpu_memory_limit", s)?),
            },
        })
    }

    /// Applies an options string `'key=value, ...'` on top of these options.
    pub fn apply(mut self, text: &str) -> Result<Self> {
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return plan_err!(
                    "option '{item}' is not of the form key=value; valid keys: {}",
                    OPTION_KEYS.join(", ")
                );
            };
            let key = key.trim().to_ascii_lowercase();
            let value = value.trim().trim_matches(|c| c == '\'' || c == '"');
            match key.as_str() {
                "p" => match value.parse::<f64>() {
                    Ok(p) if p.is_finite() && p >= 1.0 => self.p = Some(p),
                    _ => return plan_err!("option p must be a number >= 1, got '{value}'"),
                },
                "dim" => match value.parse::<u64>() {
                    Ok(d) if d >= 1 => self.dim = Some(d),
                    _ => return plan_err!("option dim must be a whole number >= 1, got '{value}'"),
                },
                "device" => self.device = value.parse()?,
                "exclude_self" => {
                    self.exclude_self = match value.to_ascii_lowercase().as_str() {
                        "true" | "1" | "yes" | "on" => true,
                        "false" | "0" | "no" | "off" => false,
                        _ => {
                            return plan_err!(
                                "option exclude_self must be true or false, got '{value}'"
                            )
                        }
                    }
                }
                "left_column" => self.left_column = Some(value.to_string()),
                "right_column" => self.right_column = Some(value.to_string()),
                "gpu_memory_limit" => {
                    self.gpu_memory_limit = Some(parse_bytes("gpu_memory_limit", value)?)
                }
                other => {
                    return plan_err!(
                        "unknown option '{other}'; valid keys: {}",
                        OPTION_KEYS.join(", ")
                    )
                }
            }
        }
        Ok(self)
    }

    /// The metric these options parameterise.
    pub fn metric(&self, name: &str) -> Result<Metric> {
        Metric::new(name, self.p, self.dim)
    }
}

/// `1073741824`, `512MiB`, `8GB`, `2 GiB` → bytes.
pub fn parse_bytes(what: &str, text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return plan_err!("{what} must be a size like 512MiB or 8GiB, got '{text}'"),
    };
    match number.parse::<f64>() {
        Ok(n) if n > 0.0 && n.is_finite() => Ok((n * scale as f64) as u64),
        _ => plan_err!("{what} must be a positive size like 512MiB or 8GiB, got '{text}'"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_string_overrides_defaults() {
        let o = JoinOptions::default()
            .apply("p=3, dim = 100, device=cpu, exclude_self=true, left_column=v, gpu_memory_limit=2GiB")
            .unwrap();
        assert_eq!(o.p, Some(3.0));
        assert_eq!(o.dim, Some(100));
        assert_eq!(o.device, DeviceChoice::Cpu);
        assert!(o.exclude_self);
        assert_eq!(o.left_column.as_deref(), Some("v"));
        assert_eq!(o.gpu_memory_limit, Some(2 << 30));
    }

    #[test]
    fn bad_options_say_what_is_valid() {
        let e = JoinOptions::default()
            .apply("colour=red")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown option 'colour'") && e.contains("exclude_self"),
            "{e}"
        );
        let e = JoinOptions::default()
            .apply("p=0.5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("p must be a number >= 1"), "{e}");
        let e = JoinOptions::default()
            .apply("device=tpu")
            .unwrap_err()
            .to_string();
        assert!(e.contains("valid: auto, cpu, gpu"), "{e}");
        let e = JoinOptions::default().apply("dim").unwrap_err().to_string();
        assert!(e.contains("key=value"), "{e}");
        assert!(parse_bytes("x", "12 parsecs").is_err());
    }
}
