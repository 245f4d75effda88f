//! The CUDA module of one metric: the prelude and generic kernels of `kernels/` (embedded in the
//! binary), the argument structs generated from [`super::args`], and the metric's `MetricDef`
//! generated from its definition in `src/metric`; compiled at run time with NVRTC.

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use datafusion::common::{exec_datafusion_err, Result};

// A file beside this one rather than a child folder: `gpu::kernels::cache`, public for its tests.
#[path = "kernel_cache.rs"]
pub mod cache;

use super::args::{
    DenseArgs, DenseFillArgs, ExactArgs, FoldedArgs, ListArgs, MaskArgs, MatrixArgs,
};
use crate::metric::cuda::cuda_definition;
use crate::metric::{KeyForm, Params, Reduction, RowTotals, Semiring};

const PRELUDE: &str = include_str!("../../kernels/metric_prelude.cuh");
const KERNELS: &str = include_str!("../../kernels/knn.cu");
const DENSE: &str = include_str!("../../kernels/dense.cu");
const EXACT: &str = include_str!("../../kernels/exact.cu");
const MATRIX: &str = include_str!("../../kernels/matrix.cu");
const MASK: &str = include_str!("../../kernels/mask.cu");

/// Threads per block of the folded kernels (a multiple of 32; the scan assumes at most 1024).
pub(crate) const FOLDED_THREADS: u32 = 512;

/// Threads per block of the distance matrix kernel (`distance_matrix` in kernels/matrix.cu): a
/// block adds one column's list segment at a time, most of them short, so a smaller block idles
/// fewer threads between the barriers.
pub(crate) const MATRIX_THREADS: u32 = 256;

/// What the GPU backend needs of a metric: its module source and the facts that size buffers.
#[derive(Debug, Clone)]
pub struct MetricProgram {
    pub name: &'static str,
    /// The whole translation unit NVRTC compiles (also the module cache key).
    pub source: String,
    pub params: Params,
    /// A max over the union (chebyshev), run by the folded kernels from the inverted lists plus
    /// each row's largest values and their ranks (see `max_pair` in kernels/knn.cu).
    pub max_reduction: bool,
    /// A sum with an exact union term (minkowski, hellinger, jensenshannon), or a max: the folded
    /// kernels bound each distance and the host computes the candidates exactly (`GpuIndex`).
    pub certified: bool,
    pub similarity: bool,
    pub two_accumulators: bool,
    /// The pair reads a per-value lift (`Semiring::LIFTED`): the right side's lists carry each
    /// entry's lift beside it (`entry_lifts` in kernels/knn.cu).
    pub lifted: bool,
    /// The pair term is a constant times x·y and the distance does not subtract the sum from
    /// the rows' totals (dot, cosine): a sum over dense columns is a matrix product, which the
    /// tensor cores take (`dense_gemm`) with float32 accuracy. The expanded forms (euclidean,
    /// sqeuclidean, correlation) cancel near zero, where the SPEC's absolute allowance
    /// (1e-3·√(‖x‖² + ‖y‖²)) needs more than float32 sums of raw counts in the thousands give.
    pub bilinear: bool,
    /// The distance of every pair whose folded sum is 0, when it is one constant whatever the
    /// rows' totals (dot: 0, cosine: 1; checked on totals with zeros): the kernels then finish
    /// only the rows of sum 0 that can be selected.
    pub zero_distance: Option<f64>,
    /// How the kernels rank a right row before finishing it (see [`KeyForm`]): a row whose
    /// filter value is not below the k-th row's is not finished. The right side's per-row
    /// `base` is its t0 (`rt0`), or for [`KeyForm::Quotient`] an array of its own.
    pub key_form: KeyForm,
    /// The kernels were generated with a filter (`MetricDef::FILTER`: the form has
    /// [`KeyForm::cuda_filter`]), so a knn launch keeps a filter value per top-k candidate.
    pub filtered: bool,
    /// The distance is finished from folded sums alone (a sum with no exact union term): the
    /// distance matrix kernel computes it (`distance_matrix` in kernels/matrix.cu), as the CPU's
    /// dense blocks do.
    pub folded: bool,
}

impl MetricProgram {
    pub fn of<S: Semiring>(s: &S) -> Self {
        let bilinear = is_bilinear(s);
        MetricProgram {
            name: S::NAME,
            source: module_source::<S>(),
            params: s.params(),
            max_reduction: S::REDUCTION == Reduction::Max,
            certified: certified::<S>(),
            similarity: S::SIMILARITY,
            two_accumulators: S::TWO_ACCUMULATORS,
            lifted: S::LIFTED,
            bilinear,
            zero_distance: if bilinear { zero_distance(s) } else { None },
            key_form: S::KEY,
            filtered: S::KEY.cuda_filter().is_some(),
            folded: S::REDUCTION == Reduction::Sum && !s.has_exact_term(),
        }
    }

    /// The entry points of this module.
    pub fn kernel_names(&self) -> [&'static str; 7] {
        [
            "folded_knn",
            "folded_radius",
            "dense_scatter",
            "dense_gemm",
            "dense_fill",
            "distance_matrix",
            "mask_program",
        ]
    }

    /// Accumulator bytes per right row of a tile (64-bit fixed point, see kernels/knn.cu).
    pub(crate) fn acc_bytes(&self) -> usize {
        8 * (if self.two_accumulators || self.max_reduction {
            2
        } else {
            1
        })
    }
}

/// Whether `s` takes the tensor-core product (see [`MetricProgram::bilinear`]): its key is the
/// sum itself or a quotient of it, and its pair term c·x·y ([`Semiring::pair_scale`]).
fn is_bilinear<S: Semiring>(s: &S) -> bool {
    S::REDUCTION == Reduction::Sum
        && !s.has_exact_term()
        && matches!(S::KEY, KeyForm::Negated | KeyForm::Quotient)
        && s.pair_scale().is_some()
}

/// `finish(0, 0, l, r)` when it is the same for every pair of totals (the metric's totals of
/// zero, small and large rows); None otherwise. Asked only of bilinear metrics, where a sum of 0
/// means nothing shared or shared terms that cancel, and both finish the same.
fn zero_distance<S: Semiring>(s: &S) -> Option<f64> {
    let totals = [0.0, 1e-30, 0.5, 1.0, 3.0, 1e6, 1e30];
    let at = |a: f64, b: f64| {
        s.finish(
            0.0,
            0.0,
            &RowTotals { t0: a, t1: a },
            &RowTotals { t0: b, t1: b },
        )
    };
    let d = at(0.0, 0.0);
    let constant = totals
        .iter()
        .all(|&a| totals.iter().all(|&b| at(a, b).to_bits() == d.to_bits()));
    (constant && d.is_finite()).then_some(d)
}

/// Whether metric `S` runs the certified path ([`MetricProgram::certified`]): only then can a
/// probe ask the kernels for bounds (`lower_bounds`) whose sums count their terms in low bits, so
/// the kernels of the other metrics are compiled without that code (`CERTIFIED_PROBES`).
fn certified<S: Semiring>() -> bool {
    (S::REDUCTION == Reduction::Sum && S::SOURCE.exact_term.is_some() && !S::SIMILARITY)
        || S::REDUCTION == Reduction::Max
}

/// The translation unit of metric `S`.
pub fn module_source<S: Semiring>() -> String {
    let [(items, segments), (items_2, segments_2)] = seg_map_rule();
    format!(
        "{PRELUDE}\n#define TOP_VALUES {}\n#define FOLDED_THREADS {FOLDED_THREADS}\n#define MATRIX_THREADS {MATRIX_THREADS}\n#define FOLDED_MIN_BLOCKS {}\n#define CERTIFIED_PROBES {}\n#define SEG_MAP_MIN_ITEMS {items}u\n#define SEG_MAP_MIN_SEGMENTS {segments}u\n#define SEG_MAP_MIN_ITEMS_2 {items_2}u\n#define SEG_MAP_MIN_SEGMENTS_2 {segments_2}u\n{}{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{KERNELS}{DENSE}\n{EXACT}\n{MATRIX}\n{MASK}",
        super::prepare::TOP_VALUES,
        folded_min_blocks(S::NAME),
        certified::<S>() as u8,
        super::prepare::dense_defines(),
        FoldedArgs::cuda_declaration(),
        DenseArgs::cuda_declaration(),
        DenseFillArgs::cuda_declaration(),
        ListArgs::cuda_declaration(),
        ExactArgs::cuda_declaration(),
        MatrixArgs::cuda_declaration(),
        MaskArgs::cuda_declaration(),
        cuda_definition::<S>()
    )
}

/// Metrics whose folded kernels fit 32 registers a thread without spilling (ptxas 13.0, sm_90;
/// `tests/nvrtc_compile.rs` checks it with ptxas): they are compiled for four blocks of 512 a
/// SM, the occupancy the tiles are sized for (`tile_rows`). Left to itself the compiler takes 38-40
/// registers, which lets only three blocks run (call BC on an H200, old and new alternated, same
/// tiles: movielens cosine kernels 1.263 -> 1.127 s, nytimes 1.85 -> 1.65 s, chebyshev 3.50 ->
/// 2.39 s; scrna cosine, whose folded kernel only finishes the tensor cores' pairs, 0.73 -> 0.80 s).
/// The others (a division, a logarithm, a power or a square root per term) spill at 32: the
/// lifted ones take three blocks ([`THREE_BLOCK_METRICS`]), the rest keep the compiler's choice.
const FOUR_BLOCK_METRICS: [&str; 11] = [
    "braycurtis",
    "chebyshev",
    "cosine",
    "dice",
    "dot",
    "euclidean",
    "hamming",
    "jaccard",
    "manhattan",
    "russellrao",
    "sqeuclidean",
];

/// The lifted metrics, compiled for three blocks of 512 a SM (40 registers a thread), whose pairs
/// read both lifts computed (`entry_lifts`): left to itself the compiler takes 48-64 registers
/// and two blocks run. H200, movielens_full (anchors.py's shape), full self-join, the same binary
/// with `SPARSE_KNN_GPU_MIN_BLOCKS=3` against without: jensenshannon 6.45 -> 5.69 s, kl_divergence
/// 4.85 -> 4.01 s, hellinger 4.44 -> 3.60 s (manhattan 2.60 s). jensenshannon's kernels spill 24-32
/// bytes a thread at this bound and are still the faster (`tests/nvrtc_compile.rs` holds them to
/// that).
const THREE_BLOCK_METRICS: [&str; 3] = ["hellinger", "jensenshannon", "kl_divergence"];

/// The folded kernels' `__launch_bounds__` minimum of blocks a SM (`FOLDED_MIN_BLOCKS`; 0: no
/// bound). `SPARSE_KNN_GPU_MIN_BLOCKS` overrides it (benchmarks).
pub fn folded_min_blocks(metric: &str) -> u32 {
    if let Some(forced) = std::env::var("SPARSE_KNN_GPU_MIN_BLOCKS")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
    {
        return forced.min(4);
    }
    if FOUR_BLOCK_METRICS.contains(&metric) {
        4
    } else if THREE_BLOCK_METRICS.contains(&metric) {
        3
    } else {
        0
    }
}

/// When the folded kernels find each work item's segment in a map rather than by a binary
/// search, as `#define`s: two `(items, segments)` rules, the map where a chunk has at least
/// `items` work items and more than `segments` segments (left nonzeros) by either. The search
/// takes log2(segments) steps an item, the map a fixed share of each window of 2,048 items
/// (zeroed, marked and max-scanned by the block), so the map pays where a chunk has many items
/// over a few segments. Call BL (H200, cosine kernels, against the earlier single rule of more
/// than one round and 64 segments, 1.042 s movielens, 1.585 s nytimes): (1025, 16) 1.026 and
/// 1.501 s, (2049, 8) 0.973 and 1.574 s, (2049, 2) 1.031 and 1.585 s; the default is the first
/// two together. `SPARSE_KNN_GPU_SEG_MAP=always`, `never`, `ITEMS,SEGMENTS` (one rule) or
/// `ITEMS,SEGMENTS;ITEMS,SEGMENTS` overrides it (tests, benchmarks).
fn seg_map_rule() -> [(u32, u32); 2] {
    let parse = |rule: &str| match rule.split_once(',').map(|(i, s)| (i.parse(), s.parse())) {
        Some((Ok(items), Ok(segments))) => Some((items, segments)),
        _ => None,
    };
    let forced = std::env::var("SPARSE_KNN_GPU_SEG_MAP").ok();
    match forced.as_deref() {
        Some("always") => [(1, 0); 2],
        Some("never") => [(u32::MAX, u32::MAX); 2],
        Some(rules) => match rules.split_once(';') {
            Some((a, b)) => parse(a).zip(parse(b)).map(|(a, b)| [a, b]),
            None => parse(rules).map(|a| [a; 2]),
        }
        .unwrap_or(DEFAULT_SEG_MAP_RULE),
        None => DEFAULT_SEG_MAP_RULE,
    }
}

const DEFAULT_SEG_MAP_RULE: [(u32, u32); 2] = [(1025, 16), (2049, 8)];

/// Whether NVRTC (libnvrtc) can be loaded; cudarc panics on a missing library, so ask first.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the candidate library names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles a module for the virtual architecture `compute_XY` (e.g. "compute_90"); the driver
/// turns the PTX into the device's own machine code when the module is loaded.
pub fn compile(source: &str, name: &str, arch: &str) -> Result<Ptx> {
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
        name: Some(format!("sparse_knn_{name}.cu")),
        ..Default::default()
    };
    compile_ptx_with_opts(source, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            exec_datafusion_err!(
                "GPU: NVRTC failed to compile the kernels of metric {name}:\n{}",
                log.to_string_lossy()
            )
        }
        other => exec_datafusion_err!("GPU: NVRTC failed: {other}"),
    })
}

/// NVRTC's options for a module compiled to machine code (a CUBIN) for the real architecture
/// `sm` (e.g. `sm_90`).
pub fn cubin_options(sm: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={sm}"),
        "--std=c++17".to_string(),
    ]
}

/// Compiles a module to machine code for the real architecture `sm` (e.g. "sm_90"), as CuPy and
/// Triton do: the driver loads it as it is, with no translation of PTX, and it can be kept on
/// disk ([`cached_cubin`]). NVRTC needs no GPU for it.
pub fn compile_cubin(source: &str, name: &str, sm: &str) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    if !nvrtc_available() {
        return Err(exec_datafusion_err!(
            "GPU: NVRTC (libnvrtc.so) cannot be loaded; install the CUDA runtime compiler \
             (e.g. pip's nvidia-cuda-nvrtc) and add its lib folder to LD_LIBRARY_PATH"
        ));
    }
    let nvrtc_err = |e: result::NvrtcError| exec_datafusion_err!("GPU: NVRTC failed: {e}");
    let text = std::ffi::CString::new(source)
        .map_err(|_| exec_datafusion_err!("GPU: the kernels' source holds a NUL byte"))?;
    let file = std::ffi::CString::new(format!("sparse_knn_{name}.cu"))
        .map_err(|_| exec_datafusion_err!("GPU: a module name holds a NUL byte"))?;
    // NVRTC may keep pointers into `text` and `file` until the program is destroyed, which the
    // guard does before they are dropped (declared after them, it is dropped first).
    struct Program(sys::nvrtcProgram);
    impl Drop for Program {
        fn drop(&mut self) {
            // SAFETY: made by `create_program` below and destroyed only here.
            let _ = unsafe { result::destroy_program(self.0) };
        }
    }
    let created = result::create_program(&text, Some(file.as_c_str()));
    let program = Program(created.map_err(nvrtc_err)?);
    // SAFETY: `program.0` is a live program until the guard drops it, and the buffers passed
    // to NVRTC are sized by the size it reported.
    unsafe {
        if result::compile_program(program.0, &cubin_options(sm)).is_err() {
            let log = result::get_program_log(program.0).map_err(nvrtc_err)?;
            let log: Vec<u8> = log
                .iter()
                .map(|&c| c as u8)
                .take_while(|&b| b != 0)
                .collect();
            return Err(exec_datafusion_err!(
                "GPU: NVRTC failed to compile the kernels of metric {name}:\n{}",
                String::from_utf8_lossy(&log)
            ));
        }
        let mut size = 0usize;
        sys::nvrtcGetCUBINSize(program.0, &mut size)
            .result()
            .map_err(nvrtc_err)?;
        let mut cubin = vec![0u8; size];
        sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast())
            .result()
            .map_err(nvrtc_err)?;
        Ok(cubin)
    }
}

/// The versions of the tools a CUBIN comes from and is loaded by: NVRTC's and the driver's
/// (part of the kernel cache's key, so that an upgrade of either compiles the kernels again).
pub fn toolchain() -> String {
    let mut nvrtc = (0, 0);
    // SAFETY: checked loadable first; the call only writes the two integers.
    let nvrtc = (nvrtc_available()
        && unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut nvrtc.0, &mut nvrtc.1) }
            .result()
            .is_ok())
    .then(|| format!("{}.{}", nvrtc.0, nvrtc.1));
    let mut driver = 0;
    // SAFETY: as above; `cuDriverGetVersion` needs no `cuInit`.
    let driver = (unsafe { cudarc::driver::sys::is_culib_present() }
        && unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) }
            .result()
            .is_ok())
    .then_some(driver);
    format!(
        "nvrtc {}; driver {}",
        nvrtc.as_deref().unwrap_or("none"),
        driver.map_or("none".to_string(), |d| d.to_string())
    )
}

/// Where a module's machine code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Read from the kernel cache.
    Cache,
    /// Compiled by NVRTC now (and kept in the cache where it has a writable folder).
    Compiled,
}

/// Module `name` of `source` as machine code for `sm`: read from `cache` when a whole file is
/// kept there for this source, options, architecture and `toolchain` ([`cache::Key`]), else
/// compiled and kept there. `fresh`: do not read the cache (its module did not load) but
/// replace what it holds.
pub fn cached_cubin(
    source: &str,
    name: &str,
    sm: &str,
    toolchain: &str,
    cache: Option<&cache::KernelCache>,
    fresh: bool,
) -> Result<(Vec<u8>, Origin)> {
    let key = cache::Key::new(source, &cubin_options(sm), sm, toolchain);
    if let Some(cubin) = cache.filter(|_| !fresh).and_then(|c| c.load(name, &key)) {
        return Ok((cubin, Origin::Cache));
    }
    let started = std::time::Instant::now();
    let cubin = compile_cubin(source, name, sm)?;
    let took = started.elapsed();
    log::debug!("NVRTC: {name} compiled for {sm} in {took:?}");
    match cache {
        Some(cache) => {
            cache.store(name, &key, &cubin);
        }
        None => cache::warn_if_nowhere(name, took),
    }
    Ok((cubin, Origin::Compiled))
}

/// Every metric's program (for the NVRTC test and diagnostics).
pub fn all_programs() -> Vec<MetricProgram> {
    use crate::metric::{Metric, MetricKind};
    MetricKind::all()
        .map(|kind| {
            let metric = Metric::from_kind(kind, None, Some(1)).expect("valid defaults");
            crate::with_semiring!(metric, s => MetricProgram::of(&s))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics whose pair term is c·x·y and whose distance does not cancel it against the
    /// totals, and only those, take the tensor-core product.
    #[test]
    fn bilinear_metrics_are_the_dot_product_family() {
        let mut bilinear: Vec<&str> = all_programs()
            .into_iter()
            .filter(|p| p.bilinear)
            .map(|p| p.name)
            .collect();
        bilinear.sort_unstable();
        assert_eq!(bilinear, ["cosine", "dot"]);
        for p in all_programs() {
            let want = match p.name {
                "dot" => Some(0.0),
                "cosine" => Some(1.0),
                _ => None,
            };
            assert_eq!(p.zero_distance, want, "{}", p.name);
        }
    }
}
