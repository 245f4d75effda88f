//! Options of the join functions and `sparse_distance`: the `'key=value, ...'` string and the
//! session settings (`SET sparse_knn.device = 'gpu'`) that give their defaults.

use std::any::Any;
use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{
    ConfigEntry, ConfigExtension, ConfigField, ExtensionOptions, Visit,
};
use datafusion::common::{plan_err, DataFusionError, Result};

use crate::metric::Metric;

/// Declares the session settings once: the struct and its defaults, DataFusion's
/// [`ConfigField`] / [`ExtensionOptions`] for it, and [`SparseKnnConfig::KEYS`].
///
/// Written out rather than taken from DataFusion's `extensions_options!`, whose `entries()` lists
/// the keys without their prefix (`device`, not `sparse_knn.device`): `SHOW sparse_knn.device`
/// checks the name against that list and failed, `SHOW ALL` showed bare `device`, and
/// `datafusion-ffi` replays every entry with `ConfigOptions::set`, which needs the prefix.
macro_rules! sparse_knn_settings {
    (
        $(#[doc = $struct_doc:literal])*
        pub struct $name:ident {
            $( $(#[doc = $doc:literal])* pub $field:ident : $ty:ty = $default:expr, )*
        }
    ) => {
        $(#[doc = $struct_doc])*
        #[derive(Debug, Clone, PartialEq)]
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl $name {
            /// The setting names, without the `sparse_knn.` prefix; each is also a key of the
            /// options string.
            pub const KEYS: &'static [&'static str] = &[$( stringify!($field) ),*];
        }

        impl ConfigField for $name {
            fn visit<V: Visit>(&self, v: &mut V, key_prefix: &str, _description: &'static str) {
                $(
                    let key = format!("{key_prefix}.{}", stringify!($field));
                    self.$field.visit(v, &key, concat!($($doc),*).trim());
                )*
            }

            fn set(&mut self, key: &str, value: &str) -> Result<()> {
                match key {
                    $( stringify!($field) => self.$field.set("", value), )*
                    // DataFusion's wording for an unknown key, plus the valid ones.
                    _ => plan_err!(
                        "Config value \"{key}\" not found on {}; valid settings: {}",
                        stringify!($name),
                        Self::KEYS
                            .iter()
                            .map(|k| format!("{}.{k}", Self::PREFIX))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            }
        }
    };
}

sparse_knn_settings! {
    /// Session defaults for the sparse-knn functions (`SET sparse_knn.<key> = ...`), a DataFusion
    /// config extension: it is part of the session's `ConfigOptions`, so it is cloned with them
    /// and travels with them to remote executors.
    pub struct SparseKnnConfig {
        /// Where joins run: auto (a CUDA GPU when one is found, else the CPU), cpu or gpu.
        pub device: String = "auto".to_string(),
        /// Minkowski degree (>= 1).
        pub p: f64 = 2.0,
        /// Dimension for hamming, russellrao and correlation (0: not set).
        pub dim: u64 = 0,
        /// Skip pairs of a row with itself: true (the same input on both sides, by row
        /// identity), a column name (pairs whose values of that column are equal), or false.
        pub exclude_self: String = "false".to_string(),
        /// Device memory a GPU join may use on each GPU, e.g. '8GiB' (empty: the device's free
        /// memory).
        pub gpu_memory_limit: String = String::new(),
        /// The GPUs a join uses, as CUDA ordinals, e.g. '0,1' (empty: every visible GPU).
        pub gpus: String = String::new(),
        /// GPU, dot and cosine: columns of the right side taken as a dense block by the
        /// tensor cores: auto (chosen by density), off,
        /// or a share of the right rows, e.g. 0.05 (every column nonzero in at least 5% of them).
        pub dense_columns: String = "auto".to_string(),
        /// Bytes of built right sides kept for later joins of the same data, e.g. '2GiB'; 0
        /// keeps none (empty: a quarter of the memory pool, half the physical memory when it is
        /// unbounded, and GPU-resident sides within the devices' memory).
        pub index_cache: String = String::new(),
    }
}

impl ConfigExtension for SparseKnnConfig {
    const PREFIX: &'static str = "sparse_knn";
}

impl ExtensionOptions for SparseKnnConfig {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        // `datafusion-ffi` hands back `sparse_knn.<key>` where DataFusion hands `<key>`.
        let key = key
            .strip_prefix(Self::PREFIX)
            .and_then(|k| k.strip_prefix('.'))
            .unwrap_or(key);
        let mut next = self.clone();
        ConfigField::set(&mut next, key, value)?;
        // Checked by the same parser as the options string, so that a bad value fails at the SET
        // that typed it rather than at the next query.
        JoinOptions::from_config(&next)?;
        *self = next;
        Ok(())
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        struct Entries(Vec<ConfigEntry>);
        impl Visit for Entries {
            fn some<V: fmt::Display>(&mut self, key: &str, value: V, description: &'static str) {
                self.0.push(ConfigEntry {
                    key: key.to_string(),
                    value: Some(value.to_string()),
                    description,
                })
            }

            fn none(&mut self, key: &str, description: &'static str) {
                self.0.push(ConfigEntry {
                    key: key.to_string(),
                    value: None,
                    description,
                })
            }
        }
        let mut entries = Entries(Vec::new());
        ConfigField::visit(self, &mut entries, Self::PREFIX, "");
        entries.0
    }
}

/// Which pairs a join skips as a row paired with itself.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub enum ExcludeSelf {
    #[default]
    Off,
    /// The row at the same position of the same input (both sides are one input).
    Identity,
    /// Pairs whose values of this column (present on both sides) are equal; NULLs equal nothing.
    Column(String),
}

impl ExcludeSelf {
    pub fn is_off(&self) -> bool {
        *self == ExcludeSelf::Off
    }

    /// Rows are skipped by their position in the one input (exclude_self=true).
    pub fn by_identity(&self) -> bool {
        *self == ExcludeSelf::Identity
    }
}

impl fmt::Display for ExcludeSelf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExcludeSelf::Off => f.write_str("false"),
            ExcludeSelf::Identity => f.write_str("true"),
            ExcludeSelf::Column(c) => f.write_str(c),
        }
    }
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

/// Keys of the options string that name columns of one call's inputs, so they are not session
/// settings.
pub const PER_CALL_KEYS: &[&str] = &["left_column", "right_column", "right_shards", "within"];

/// Every key the options string accepts: the session settings ([`SparseKnnConfig::KEYS`]) and
/// [`PER_CALL_KEYS`], in the order error messages list them. (A test checks that it stays
/// exactly those.)
pub const OPTION_KEYS: &[&str] = &[
    "p",
    "dim",
    "device",
    "exclude_self",
    "within",
    "left_column",
    "right_column",
    "gpu_memory_limit",
    "gpus",
    "dense_columns",
    "right_shards",
    "index_cache",
];

/// Options of one call, after session defaults and the options string are applied.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinOptions {
    pub p: Option<f64>,
    pub dim: Option<u64>,
    pub device: DeviceChoice,
    pub exclude_self: ExcludeSelf,
    /// `within=COLUMN`: only right rows whose COLUMN equals the left row's (NULL matches none).
    pub within: Option<String>,
    pub left_column: Option<String>,
    pub right_column: Option<String>,
    pub gpu_memory_limit: Option<u64>,
    /// The GPUs to use (CUDA ordinals, in order, no repeats); None: every visible GPU.
    pub gpus: Option<Vec<usize>>,
    /// Which right columns a GPU join multiplies on the tensor cores.
    pub dense_columns: DenseColumnChoice,
    /// Split the right side into this many shards (row i in shard i mod n), joined as separate
    /// tasks and merged; 1: one build of the whole right side.
    pub right_shards: usize,
    /// Bytes of built right sides the session keeps (`index_cache`); None: the default.
    pub index_cache: Option<u64>,
}

impl Default for JoinOptions {
    fn default() -> Self {
        Self::from_config(&SparseKnnConfig::default()).expect("defaults are valid")
    }
}

impl JoinOptions {
    /// The session's defaults. Every setting goes through the options string's parser, so the
    /// two accept the same values and say the same things about bad ones.
    pub fn from_config(config: &SparseKnnConfig) -> Result<Self> {
        let mut options = Self {
            p: None,
            dim: None,
            device: DeviceChoice::Auto,
            exclude_self: ExcludeSelf::Off,
            within: None,
            left_column: None,
            right_column: None,
            gpu_memory_limit: None,
            gpus: None,
            dense_columns: DenseColumnChoice::Auto,
            right_shards: 1,
            index_cache: None,
        };
        for entry in config.entries() {
            let key = entry.key.strip_prefix("sparse_knn.").unwrap_or(&entry.key);
            let Some(value) = entry.value else { continue };
            // The settings' "not set" values.
            if (key == "dim" && value == "0")
                || (matches!(key, "gpu_memory_limit" | "gpus" | "index_cache") && value.is_empty())
            {
                continue;
            }
            options
                .set(key, &value)
                .map_err(|e| DataFusionError::Plan(format!("setting sparse_knn.{key}: {e}")))?;
        }
        Ok(options)
    }

    /// Applies an options string `'key=value, ...'` on top of these options.
    pub fn apply(mut self, text: &str) -> Result<Self> {
        // `gpus=0,1` holds the separator: a bare ordinal after it continues its list.
        let mut items: Vec<String> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match items.last_mut() {
                Some(last)
                    if !item.contains('=')
                        && last.trim_start().to_ascii_lowercase().starts_with("gpus") =>
                {
                    last.push(',');
                    last.push_str(item);
                }
                _ => items.push(item.to_string()),
            }
        }
        for item in &items {
            let Some((key, value)) = item.split_once('=') else {
                return plan_err!(
                    "option '{item}' is not of the form key=value; valid keys: {}",
                    OPTION_KEYS.join(", ")
                );
            };
            let key = key.trim().to_ascii_lowercase();
            let value = value.trim().trim_matches(|c| c == '\'' || c == '"');
            if let Err(e) = self.set(&key, value) {
                return plan_err!("{e}");
            }
        }
        Ok(self)
    }

    /// One `key=value`; the error is the message alone, for the caller to frame.
    fn set(&mut self, key: &str, value: &str) -> std::result::Result<(), String> {
        match key {
            "p" => match value.parse::<f64>() {
                Ok(p) if p.is_finite() && p >= 1.0 => self.p = Some(p),
                _ => return Err(format!("option p must be a number >= 1, got '{value}'")),
            },
            "dim" => match value.parse::<u64>() {
                Ok(d) if d >= 1 => self.dim = Some(d),
                _ => {
                    return Err(format!(
                        "option dim must be a whole number >= 1, got '{value}'"
                    ))
                }
            },
            "device" => self.device = value.parse().map_err(|e| message(&e))?,
            "exclude_self" => {
                self.exclude_self = match value.to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" | "on" => ExcludeSelf::Identity,
                    "false" | "0" | "no" | "off" => ExcludeSelf::Off,
                    _ if !value.is_empty()
                        && value
                            .chars()
                            .all(|c| c.is_alphanumeric() || c == '_' || c == ' ') =>
                    {
                        ExcludeSelf::Column(value.to_string())
                    }
                    _ => {
                        return Err(format!(
                            "option exclude_self must be true, false or a column name, got \
                             '{value}'"
                        ))
                    }
                }
            }
            "within" => {
                if value.is_empty()
                    || !value
                        .chars()
                        .all(|c| c.is_alphanumeric() || c == '_' || c == ' ')
                {
                    return Err(format!(
                        "option within must be a column name (the left and right rows' group, \
                         e.g. within=tenant), got '{value}'"
                    ));
                }
                self.within = Some(value.to_string())
            }
            "left_column" => self.left_column = Some(value.to_string()),
            "right_column" => self.right_column = Some(value.to_string()),
            "gpu_memory_limit" => {
                self.gpu_memory_limit =
                    Some(parse_bytes("gpu_memory_limit", value).map_err(|e| message(&e))?)
            }
            "gpus" => self.gpus = Some(parse_gpus(value)?),
            "index_cache" => {
                self.index_cache = Some(match value.trim() {
                    "0" => 0,
                    size => parse_bytes("index_cache", size).map_err(|e| message(&e))?,
                })
            }
            "dense_columns" => self.dense_columns = DenseColumnChoice::parse(value)?,
            "right_shards" => match value.parse::<usize>() {
                Ok(n) if (1..=4096).contains(&n) => self.right_shards = n,
                _ => {
                    return Err(format!(
                        "option right_shards must be a whole number from 1 to 4096, got '{value}'"
                    ))
                }
            },
            other => {
                return Err(format!(
                    "unknown option '{other}'; valid keys: {}",
                    OPTION_KEYS.join(", ")
                ))
            }
        }
        Ok(())
    }

    /// The metric these options parameterise.
    pub fn metric(&self, name: &str) -> Result<Metric> {
        Metric::new(name, self.p, self.dim)
    }
}

/// `0,1` → [0, 1]: CUDA ordinals, at least one, none repeated (whether they exist is checked
/// where the join runs).
/// Which columns of the right side a GPU join of dot or cosine takes as a dense block on the
/// tensor cores (option `dense_columns`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum DenseColumnChoice {
    /// Chosen by a cost model from each column's share of the right rows.
    #[default]
    Auto,
    /// None: every column through the inverted lists.
    Off,
    /// Every column nonzero in at least this share (0 < s <= 1) of the right rows.
    MinShare(f64),
}

impl DenseColumnChoice {
    fn parse(value: &str) -> std::result::Result<Self, String> {
        match value.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "off" | "false" | "none" => Ok(Self::Off),
            v => match v.parse::<f64>() {
                Ok(s) if s > 0.0 && s <= 1.0 => Ok(Self::MinShare(s)),
                _ => Err(format!(
                    "option dense_columns must be auto, off or a share of the right rows \
                     above 0 and at most 1 (e.g. 0.05), got '{value}'"
                )),
            },
        }
    }
}

fn parse_gpus(value: &str) -> std::result::Result<Vec<usize>, String> {
    let bad = || {
        format!(
            "option gpus must list CUDA device ordinals, e.g. gpus=0,1 (none repeated), got \
             '{value}'"
        )
    };
    let mut list = Vec::new();
    for part in value.split(',').map(str::trim) {
        let g: usize = part.parse().map_err(|_| bad())?;
        if list.contains(&g) {
            return Err(bad());
        }
        list.push(g);
    }
    if list.is_empty() {
        return Err(bad());
    }
    Ok(list)
}

/// A planning error's message without DataFusion's "Error during planning: " framing.
fn message(e: &DataFusionError) -> String {
    match e {
        DataFusionError::Plan(m) => m.clone(),
        other => other.strip_backtrace(),
    }
}

/// `1073741824`, `512MiB`, `8GB`, `2 GiB`, `2G` → bytes.
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

/// The session's defaults for the options (the `sparse_knn.*` settings, when registered).
pub fn session_options(config: &datafusion::common::config::ConfigOptions) -> Result<JoinOptions> {
    match config.extensions.get::<SparseKnnConfig>() {
        Some(c) => JoinOptions::from_config(c),
        None => Ok(JoinOptions::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::config::ConfigOptions;

    #[test]
    fn options_string_overrides_defaults() {
        let o = JoinOptions::default()
            .apply("p=3, dim = 100, device=cpu, exclude_self=true, left_column=v, gpu_memory_limit=2GiB")
            .unwrap();
        assert_eq!(o.p, Some(3.0));
        assert_eq!(o.dim, Some(100));
        assert_eq!(o.device, DeviceChoice::Cpu);
        assert_eq!(o.exclude_self, ExcludeSelf::Identity);
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

    #[test]
    fn settings_and_options_string_are_one_list() {
        let mut keys: Vec<&str> = SparseKnnConfig::KEYS.to_vec();
        keys.extend_from_slice(PER_CALL_KEYS);
        keys.sort();
        let mut listed = OPTION_KEYS.to_vec();
        listed.sort();
        assert_eq!(keys, listed);
        // Every setting's default is a value the options string accepts for that key.
        for entry in SparseKnnConfig::default().entries() {
            let key = entry.key.strip_prefix("sparse_knn.").unwrap();
            let value = entry.value.unwrap();
            if (key == "dim" && value == "0") || value.is_empty() {
                continue;
            }
            JoinOptions::default()
                .apply(&format!("{key}={value}"))
                .unwrap_or_else(|e| panic!("{key}={value}: {e}"));
        }
    }

    #[test]
    fn settings_are_listed_with_their_prefix_and_checked_when_set() {
        let mut config = SparseKnnConfig::default();
        let keys: Vec<String> = config.entries().into_iter().map(|e| e.key).collect();
        assert_eq!(
            keys,
            [
                "sparse_knn.device",
                "sparse_knn.p",
                "sparse_knn.dim",
                "sparse_knn.exclude_self",
                "sparse_knn.gpu_memory_limit",
                "sparse_knn.gpus",
                "sparse_knn.dense_columns",
                "sparse_knn.index_cache"
            ]
        );
        ExtensionOptions::set(&mut config, "device", "cpu").unwrap();
        ExtensionOptions::set(&mut config, "sparse_knn.p", "3").unwrap();
        assert_eq!((config.device.as_str(), config.p), ("cpu", 3.0));
        let e = ExtensionOptions::set(&mut config, "device", "tpu")
            .unwrap_err()
            .to_string();
        assert!(e.contains("valid: auto, cpu, gpu"), "{e}");
        assert_eq!(config.device, "cpu", "a rejected SET changes nothing");
        let e = ExtensionOptions::set(&mut config, "p", "0.5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("p must be a number >= 1"), "{e}");
        let e = ExtensionOptions::set(&mut config, "colour", "red")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sparse_knn.device"), "{e}");
    }

    #[test]
    fn settings_travel_as_key_value_pairs() {
        // What a remote executor (or datafusion-ffi) does: replay the entries with
        // `ConfigOptions::set` on a fresh config that has the extension registered.
        let mut sent = ConfigOptions::new();
        sent.extensions.insert(SparseKnnConfig::default());
        sent.set("sparse_knn.device", "cpu").unwrap();
        sent.set("sparse_knn.dim", "64").unwrap();
        sent.set("sparse_knn.gpu_memory_limit", "2GiB").unwrap();
        let mut received = ConfigOptions::new();
        received.extensions.insert(SparseKnnConfig::default());
        for entry in sent.entries() {
            if let Some(value) = entry.value {
                if entry.key.starts_with("sparse_knn.") {
                    received.set(&entry.key, &value).unwrap();
                }
            }
        }
        let got = received.extensions.get::<SparseKnnConfig>().unwrap();
        assert_eq!(got, sent.extensions.get::<SparseKnnConfig>().unwrap());
        let options = JoinOptions::from_config(got).unwrap();
        assert_eq!(options.device, DeviceChoice::Cpu);
        assert_eq!(options.dim, Some(64));
        assert_eq!(options.gpu_memory_limit, Some(2 << 30));
    }
}
