//! Compiled kernels kept on disk, so that a fresh process loads a metric's module instead of
//! running NVRTC again (as CuPy's `~/.cupy/kernel_cache` and Triton's `~/.triton/cache` do).
//!
//! A module is compiled for the device's real architecture (`sm_XX`) and kept as the CUBIN NVRTC
//! gives, under a [`Key`] hashed from everything that shapes it: the module's whole source (the
//! metric's generated definition and every `#define` included), the compile options, the
//! architecture and the NVRTC and driver versions. The folder is `$SPARSE_KNN_KERNEL_CACHE`, else
//! `$XDG_CACHE_HOME/sparse-knn/kernels`, else `~/.cache/sparse-knn/kernels`;
//! `SPARSE_KNN_KERNEL_CACHE=off` turns the cache off.
//!
//! The cache only ever saves time: a folder that cannot be written, or a file that is missing,
//! truncated, corrupted or written for another key, is a warning and a compile, never an error.
//! Each file is written under a name of its own in the same folder and renamed into place, so
//! processes compiling the same module at once each leave a whole file, and a reader sees a whole
//! file or none; a header (magic, format, key, length and checksum of the CUBIN) rejects anything
//! else.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The variable naming the folder (or `off`).
pub const ENV: &str = "SPARSE_KNN_KERNEL_CACHE";

const MAGIC: [u8; 8] = *b"SKNNCUBN";
/// Bumped when the header or what the key covers changes: older files are then never read.
const FORMAT: u32 = 1;
/// Magic, format, a reserved word, key, payload length, payload checksum.
pub const HEADER_BYTES: usize = 8 + 4 + 4 + 16 + 8 + 8;

/// What a cached module is filed under: a 128-bit hash of all that shapes the compiled code.
/// (`std::hash` is not stable across Rust releases, so the hash is FNV-1a, written out.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(u128);

impl Key {
    /// `source`: the whole translation unit; `options`: NVRTC's options; `arch`: e.g. `sm_90`;
    /// `toolchain`: the NVRTC and driver versions. Each part is hashed with its length, so no
    /// two different lists of parts run together into the same bytes.
    pub fn new(source: &str, options: &[String], arch: &str, toolchain: &str) -> Key {
        let mut h = Fnv128::new();
        h.part(&FORMAT.to_le_bytes());
        h.part(source.as_bytes());
        h.part(&(options.len() as u64).to_le_bytes());
        for option in options {
            h.part(option.as_bytes());
        }
        h.part(arch.as_bytes());
        h.part(toolchain.as_bytes());
        Key(h.0)
    }

    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;

    fn new() -> Self {
        Fnv128(Self::OFFSET)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u128).wrapping_mul(Self::PRIME);
        }
    }

    fn part(&mut self, bytes: &[u8]) {
        self.bytes(&(bytes.len() as u64).to_le_bytes());
        self.bytes(bytes);
    }
}

/// FNV-1a, 64 bits: the payload's checksum (it catches a damaged or truncated file; the key
/// in the header, not this, says which module the file is).
fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    h
}

/// A cache file's bytes: the header, then the CUBIN.
pub fn encode(key: &Key, cubin: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + cubin.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&key.0.to_le_bytes());
    out.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(cubin).to_le_bytes());
    out.extend_from_slice(cubin);
    out
}

/// The CUBIN in a cache file's bytes, or why they are not a whole file written for `key`.
pub fn decode<'a>(key: &Key, bytes: &'a [u8]) -> Result<&'a [u8], String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!("{} bytes, shorter than the header", bytes.len()));
    }
    let (header, payload) = bytes.split_at(HEADER_BYTES);
    let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    if header[..8] != MAGIC {
        return Err("not a sparse-knn kernel cache file".into());
    }
    if u32_at(8) != FORMAT {
        return Err(format!("format {}, not {FORMAT}", u32_at(8)));
    }
    if u128::from_le_bytes(header[16..32].try_into().expect("16 bytes")) != key.0 {
        return Err("written for another module".into());
    }
    let length = u64_at(32);
    if length != payload.len() as u64 {
        return Err(format!(
            "{} bytes of CUBIN where the header says {length} (truncated?)",
            payload.len()
        ));
    }
    if checksum(payload) != u64_at(40) {
        return Err("the CUBIN's checksum does not match (corrupted)".into());
    }
    Ok(payload)
}

/// Why there is no cache folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoFolder {
    /// `SPARSE_KNN_KERNEL_CACHE=off`.
    Off,
    /// Neither the variable nor `XDG_CACHE_HOME` nor `HOME` gives one.
    Nowhere,
}

/// The cache folder the environment `var` gives (see the module's documentation).
/// `XDG_CACHE_HOME` counts only when absolute, as the XDG specification says.
pub fn folder_from(var: impl Fn(&str) -> Option<String>) -> Result<PathBuf, NoFolder> {
    let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    if let Some(dir) = set(ENV) {
        if dir.trim().eq_ignore_ascii_case("off") {
            return Err(NoFolder::Off);
        }
        return Ok(PathBuf::from(dir));
    }
    if let Some(xdg) = set("XDG_CACHE_HOME").filter(|d| Path::new(d).is_absolute()) {
        return Ok(Path::new(&xdg).join("sparse-knn").join("kernels"));
    }
    match set("HOME") {
        Some(home) => Ok(Path::new(&home).join(".cache/sparse-knn/kernels")),
        None => Err(NoFolder::Nowhere),
    }
}

/// The cache folder this process's environment gives.
pub fn folder() -> Result<PathBuf, NoFolder> {
    folder_from(|name| std::env::var(name).ok())
}

/// What this process did with the cache (for tests and diagnostics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules read from the cache.
    pub hits: u64,
    /// Modules looked for and not there (then compiled).
    pub misses: u64,
    /// Files found and rejected (damaged, another format or key), or whose module the driver
    /// refused (then compiled and replaced).
    pub rejected: u64,
    /// Files written.
    pub stored: u64,
    /// Files that could not be written (the folder missing and not creatable, read-only, full).
    pub store_failures: u64,
}

static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static REJECTED: AtomicU64 = AtomicU64::new(0);
static STORED: AtomicU64 = AtomicU64::new(0);
static STORE_FAILURES: AtomicU64 = AtomicU64::new(0);

/// This process's counts so far.
pub fn stats() -> CacheStats {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    CacheStats {
        hits: get(&HITS),
        misses: get(&MISSES),
        rejected: get(&REJECTED),
        stored: get(&STORED),
        store_failures: get(&STORE_FAILURES),
    }
}

/// Counts a cached module the driver would not load (it is then compiled and replaced).
pub(crate) fn count_refused() {
    REJECTED.fetch_add(1, Ordering::Relaxed);
}

/// A cache folder.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        KernelCache { dir: dir.into() }
    }

    /// The cache of this process's environment, or None where it is off or has no folder.
    pub fn from_env() -> Option<Self> {
        folder().ok().map(Self::at)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of module `name` (a metric's name, for people looking at the folder) and `key`.
    pub fn path(&self, name: &str, key: &Key) -> PathBuf {
        let name: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.dir.join(format!("{name}-{}.cubin", key.hex()))
    }

    /// The CUBIN kept for `key`, or None: not there, or there and unusable (a warning; the
    /// caller compiles and [`store`](Self::store)s over it).
    pub fn load(&self, name: &str, key: &Key) -> Option<Vec<u8>> {
        let path = self.path(name, key);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) => {
                MISSES.fetch_add(1, Ordering::Relaxed);
                if e.kind() != std::io::ErrorKind::NotFound {
                    log::warn!(
                        "GPU kernel cache: cannot read {} ({e}); compiling the kernels",
                        path.display()
                    );
                }
                return None;
            }
        };
        match decode(key, &bytes) {
            Ok(cubin) => {
                HITS.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "GPU kernel cache: {name} kernels read from {}",
                    path.display()
                );
                Some(cubin.to_vec())
            }
            Err(why) => {
                REJECTED.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "GPU kernel cache: {} is unusable ({why}); compiling the kernels again and \
                     replacing it",
                    path.display()
                );
                None
            }
        }
    }

    /// Keeps `cubin` for `key`, replacing any file there; whether it was written. A failure is a
    /// warning (once per process; later ones are logged at debug level).
    pub fn store(&self, name: &str, key: &Key, cubin: &[u8]) -> bool {
        let path = self.path(name, key);
        match write_atomically(&self.dir, &path, &encode(key, cubin)) {
            Ok(()) => {
                STORED.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "GPU kernel cache: {name} kernels kept in {}",
                    path.display()
                );
                true
            }
            Err(e) => {
                STORE_FAILURES.fetch_add(1, Ordering::Relaxed);
                static WARNED: AtomicBool = AtomicBool::new(false);
                let message = format!(
                    "GPU kernel cache: cannot keep the compiled kernels in {} ({e}), so every \
                     process compiles them again; set {ENV} to a writable folder (or to `off`)",
                    self.dir.display()
                );
                if WARNED.swap(true, Ordering::Relaxed) {
                    log::debug!("{message}");
                } else {
                    log::warn!("{message}");
                }
                false
            }
        }
    }
}

/// Writes `bytes` to a file of its own in `dir` and renames it to `path`: a rename within a
/// folder replaces the target at once, so readers and other writers never see part of a file.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let temporary = dir.join(format!(
        ".{}.{}-{}-{nanos}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("kernels"),
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed),
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .and_then(|mut file| file.write_all(bytes))
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Says once per process that every process compiles the kernels again because the cache has
/// no folder, when a compile took long enough to matter.
pub(crate) fn warn_if_nowhere(metric: &str, took: std::time::Duration) {
    static SAID: std::sync::Once = std::sync::Once::new();
    if took > std::time::Duration::from_millis(400) && folder() == Err(NoFolder::Nowhere) {
        SAID.call_once(|| {
            log::warn!(
                "GPU: compiling the {metric} kernels took {:.1} s and every process will take \
                 it again: the kernel cache has no folder (no HOME, no XDG_CACHE_HOME); set {ENV} \
                 to a writable folder that outlives the process",
                took.as_secs_f64()
            )
        });
    }
}
