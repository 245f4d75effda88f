//! The CUDA backend: the generic semiring kernels of `kernels/`, instantiated per metric with the
//! CUDA generated from `src/metric`, compiled at run time with NVRTC for the device's own
//! architecture.
//!
//! - `device`: discovery, one context and stream per device, the modules compiled per metric;
//! - `memory`: uploads and downloads; `prepare`: the right side as the kernels read it;
//! - `args`: the kernels' parameter structs (their CUDA twins are generated); `launch`: one
//!   launch, from arguments to pairs; `index`: building the right side, chunking the probes.
//!
//! Everything goes through cudarc with dynamic loading: a build needs no CUDA, and a machine
//! without a driver or a device answers `is_available() == false` and a clear error from
//! `GpuIndex::build`.

mod args;
mod device;
mod index;
pub mod kernels;
mod launch;
mod lists;
mod memory;
mod prepare;
mod stats;

use std::time::Duration;

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::BooleanBuffer;
use datafusion::common::{exec_datafusion_err, exec_err, Result};

#[doc(hidden)]
pub use device::fault_for_tests;
pub use index::GpuIndex;
pub(crate) use prepare::{ColumnMap, ColumnProfile};
pub use stats::{process_stats, reset_process_stats, GpuOptions, GpuStats};

use crate::join::{
    join_pieces, join_shards, max_chunk_nnz, probe_masked_by_growing, probe_within_groups,
    split_row_ranges, Backend, Cancel, GroupedProbe, JoinIndex, MaskProgram, MatrixOut, MatrixRows,
    PairList, ProbeOptions, Probed, ReplicatedIndex, RowMask, Selection,
};
use crate::metric::{Metric, Semiring};
use crate::vector::SparseBatch;

/// Whether a CUDA driver and at least one device can be used.
pub fn is_available() -> bool {
    device::device(0).is_ok()
}

/// Closes the GPUs that no query uses any more, destroying their contexts now rather than at
/// the process's exit; returns how many it closed (see [`device::close_unused`]).
pub fn close_unused() -> usize {
    device::close_unused()
}

/// Whether a CUDA driver library can be loaded (without initialising it).
pub fn has_driver() -> bool {
    // SAFETY: only tries to dlopen the candidate library names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Why `device=auto` does not run on the GPU (no driver, no device, no NVRTC to compile the
/// kernels), or None when it does.
pub fn auto_fallback_reason() -> Option<String> {
    if let Err(e) = device::device(0) {
        return Some(e.to_string());
    }
    if !kernels::nvrtc_available() {
        return Some(
            "NVRTC (libnvrtc.so) cannot be loaded, so the kernels cannot be compiled".into(),
        );
    }
    None
}

/// A one-line description of the device that `GpuIndex::build` uses (for EXPLAIN and the CLI),
/// or the reason there is none.
pub fn describe() -> String {
    match device::device(0) {
        Ok(d) => format!("{d:?}"),
        Err(e) => e.to_string(),
    }
}

impl GpuIndex {
    /// Prepares `right` and uploads it to the first GPU. Errors (no driver, no device, kernels
    /// that fail to compile, not enough memory) say what went wrong.
    pub fn build(right: &SparseBatch, metric: &Metric, options: &GpuOptions) -> Result<Self> {
        crate::with_semiring!(metric, s => Self::build_with(right, &s, options))
    }

    /// [`GpuIndex::build`] for any metric definition, including one defined outside the crate.
    pub fn build_with<S: Semiring>(
        right: &SparseBatch,
        s: &S,
        options: &GpuOptions,
    ) -> Result<Self> {
        let device = device::device(0)?;
        Self::build_on(device, right, s, options, None)
    }
}

/// Frees `value` on a thread of its own: the build's host copies of the right side (hundreds of
/// MB at the paper's shapes) take ~9 ms per 150 MB to give back to the system, time the probes
/// need not wait for.
pub(crate) fn drop_later<T: Send + 'static>(value: T) {
    // Where no thread can be started, the refused closure drops `value` here.
    let _ = std::thread::Builder::new()
        .name("sparse-knn-free".into())
        .spawn(move || drop(value));
}

/// Right rows per GPU below which several GPUs each hold the whole right side rather than a
/// shard of it. A probe's kernels give a block to each left row, which walks its shard's tiles
/// of right rows: a shard of one or two tiles leaves each GPU all of every left row's fixed work,
/// which whole copies split between the GPUs. From a few tiles on, shards won at each of the
/// paper's four shapes (66,000-663,000 rows; two H100s, call AG: movielens 1.16-1.19 s sharded
/// against 1.25-1.35 whole on each, nytimes 1.89 against 2.17, scrna 1.45 against 1.94, secedgar
/// 2.78 against 2.92): each GPU lays out and uploads only its shard, and its launches keep every
/// left row of a probe.
pub const REPLICATE_BELOW_ROWS: usize = 16_384;

/// Joins on a CUDA GPU.
#[derive(Debug, Clone, Default)]
pub struct GpuBackend {
    pub options: GpuOptions,
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn build(&self, right: &SparseBatch, metric: &Metric) -> Result<Box<dyn JoinIndex>> {
        Ok(Box::new(GpuIndex::build(right, metric, &self.options)?))
    }

    /// With several GPUs, the right side sharded over them (consecutive row ranges of about
    /// equal nonzeros, one per GPU, cut further where a range passes [`max_chunk_nnz`]), each
    /// GPU building its shards on its own thread, context and share of the host's cores, probes
    /// asking every GPU at once and merging their top-k lists. A right side of fewer than
    /// [`REPLICATE_BELOW_ROWS`] rows a GPU is instead whole on each GPU where it stays resident
    /// on each (prepared once, uploaded to all at once; probes go whole to the least busy GPU or
    /// are split between idle ones, and nothing is merged).
    fn build_pieces(
        &self,
        pieces: Vec<SparseBatch>,
        metric: &Metric,
    ) -> Result<Box<dyn JoinIndex>> {
        self.build_profiled(pieces, metric, None)
    }
}

impl GpuBackend {
    /// [`Backend::build_pieces`], each chunk's column profile taken from `profiles` ((rows,
    /// profile) per chunk, kept in an index file) where they are the chunks this build makes.
    pub(crate) fn build_profiled(
        &self,
        mut pieces: Vec<SparseBatch>,
        metric: &Metric,
        profiles: Option<Vec<(usize, ColumnProfile)>>,
    ) -> Result<Box<dyn JoinIndex>> {
        let ordinals = self.ordinals()?;
        let total: usize = pieces.iter().map(SparseBatch::nnz).sum();
        let rows: usize = pieces.iter().map(SparseBatch::len).sum();
        // `SPARSE_KNN_GPU_SPREAD=shard` or `=replicate` overrides the choice (to compare the two
        // in benchmarks).
        let replicate = match std::env::var("SPARSE_KNN_GPU_SPREAD").as_deref() {
            Ok("shard") => false,
            Ok("replicate") => true,
            _ => rows < REPLICATE_BELOW_ROWS * ordinals.len(),
        };
        if replicate && ordinals.len() > 1 && total > 0 && total <= max_chunk_nnz() {
            let right = if pieces.len() == 1 {
                pieces.pop().expect("one piece")
            } else {
                SparseBatch::concat(&pieces)?
            };
            if let Some(index) = self.build_replicated(&ordinals, &right, metric)? {
                return Ok(Box::new(index));
            }
            log::debug!("GPU: the right side does not stay on each GPU: sharded over them");
            pieces = vec![right];
        }
        let per_gpu = total.div_ceil(ordinals.len()).max(1);
        // A share may pass its even part by up to one row: cut exactly at it, the last rows
        // made a chunk of their own (a 1-row shard, probed and merged on every probe).
        let longest = pieces
            .iter()
            .map(SparseBatch::max_row_len)
            .max()
            .unwrap_or(0);
        let started = std::time::Instant::now();
        // Each chunk is copied into one batch by the thread that builds it.
        let chunks = split_row_ranges(pieces, (per_gpu + longest).min(max_chunk_nnz()));
        let chunk_nnz = |c: &[SparseBatch]| c.iter().map(SparseBatch::nnz).sum::<usize>();
        let chunk_rows: Vec<usize> = chunks
            .iter()
            .map(|c| c.iter().map(SparseBatch::len).sum())
            .collect();
        // Profiles made for other chunks (another number of GPUs) are of no use.
        let profiles = profiles.filter(|p| {
            p.len() == chunks.len() && p.iter().zip(&chunk_rows).all(|((r, _), c)| r == c)
        });
        log::debug!(
            "GPU: the right side cut into {} chunks for {} GPU(s) in {:?}",
            chunks.len(),
            ordinals.len(),
            started.elapsed()
        );
        if chunks.is_empty() {
            // No right rows: one empty index on the first GPU answers every probe with nothing.
            let device = device::device(ordinals[0])?;
            let empty = SparseBatch::concat(&[])?;
            return Ok(Box::new(crate::with_semiring!(metric, s => {
                GpuIndex::build_on(device, &empty, &s, &self.options, None)
            })?));
        }
        // A chunk goes to the GPU whose share of the nonzeros holds its middle (by its start, a
        // chunk cut a little short of a share's end would join that share).
        let mut owner = Vec::with_capacity(chunks.len());
        let mut seen = 0usize;
        for c in &chunks {
            let nnz = chunk_nnz(c);
            owner.push(((seen + nnz / 2) / per_gpu).min(ordinals.len() - 1));
            seen += nnz;
        }
        let mut options = self.options.clone();
        if let Some(limit) = options.memory_limit {
            // The limit is per GPU: its shards share it.
            let most = (0..ordinals.len())
                .map(|g| owner.iter().filter(|&&o| o == g).count())
                .max()
                .unwrap_or(1)
                .max(1);
            options.memory_limit = Some(limit / most as u64);
        }
        // Each GPU's shards are laid out on a share of the host's cores: in one pool, the
        // layouts' per-column passes (as long for half the rows as for all) queued behind each
        // other (on two H100s: one half prepared in 80 ms, the other in 167).
        let gpus = ordinals.len();
        let threads = (rayon::current_num_threads() / gpus).max(1);
        let built: Vec<Result<Vec<(usize, GpuIndex)>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ordinals
                .iter()
                .enumerate()
                .map(|(g, &ordinal)| {
                    let (chunks, owner, options) = (&chunks, &owner, &options);
                    let profiles = profiles.as_deref();
                    scope.spawn(move || {
                        let opening = std::time::Instant::now();
                        let device = device::device(ordinal)?;
                        log::debug!(
                            "GPU {ordinal}: open for the build after {:?}",
                            opening.elapsed()
                        );
                        let build = || {
                            (0..chunks.len())
                                .filter(|&i| owner[i] == g)
                                .map(|i| {
                                    let chunk = join_pieces(&chunks[i])?;
                                    let index = crate::with_semiring!(metric, s => {
                                        GpuIndex::build_on(
                                            Arc::clone(&device),
                                            &chunk,
                                            &s,
                                            options,
                                            profiles.map(|p| &p[i].1),
                                        )
                                    })?;
                                    drop_later(chunk);
                                    Ok((i, index))
                                })
                                .collect()
                        };
                        if gpus == 1 {
                            return build();
                        }
                        match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
                            Ok(pool) => pool.install(build),
                            Err(_) => build(),
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(exec_datafusion_err!("GPU: a build panicked")))
                })
                .collect()
        });
        let mut indexes: Vec<Option<GpuIndex>> = (0..chunks.len()).map(|_| None).collect();
        for per_device in built {
            for (i, index) in per_device? {
                indexes[i] = Some(index);
            }
        }
        let indexes = indexes
            .into_iter()
            .zip(chunk_rows)
            .enumerate()
            .map(|(i, (index, rows))| {
                let index =
                    index.ok_or_else(|| exec_datafusion_err!("GPU: shard {i} was not built"))?;
                Ok((rows, Box::new(index) as Box<dyn JoinIndex>))
            })
            .collect::<Result<Vec<_>>>()?;
        join_shards(indexes, metric.kind.is_similarity(), true)
    }

    /// The whole of `right` on each GPU of `ordinals`, or None when it does not stay resident
    /// on each.
    fn build_replicated(
        &self,
        ordinals: &[usize],
        right: &SparseBatch,
        metric: &Metric,
    ) -> Result<Option<ReplicatedIndex>> {
        let devices = ordinals
            .iter()
            .map(|&o| device::device(o))
            .collect::<Result<Vec<_>>>()?;
        let replicas = crate::with_semiring!(metric, s => {
            GpuIndex::build_replicas(&devices, right, &s, &self.options)
        })?;
        let Some(replicas) = replicas else {
            return Ok(None);
        };
        let replicas = replicas
            .into_iter()
            .map(|index| Box::new(index) as Box<dyn JoinIndex>)
            .collect();
        Ok(Some(ReplicatedIndex::new(replicas, right)?))
    }

    /// [`GpuBackend::build_pieces`]'s whole-on-each-GPU index over any list of ordinals, one GPU
    /// named twice included: a machine with one GPU tests the replicas' build and probe split.
    /// A probe of `min_range_rows` rows per idle replica is cut between them.
    #[doc(hidden)]
    pub fn replicated_for_tests(
        &self,
        ordinals: &[usize],
        right: &SparseBatch,
        metric: &Metric,
        min_range_rows: usize,
    ) -> Result<Box<dyn JoinIndex>> {
        let index = self
            .build_replicated(ordinals, right, metric)?
            .ok_or_else(|| exec_datafusion_err!("GPU: the right side does not fit on each GPU"))?;
        Ok(Box::new(index.with_min_range_rows(min_range_rows)))
    }

    /// Opens each GPU of this backend and compiles and loads `metric`'s kernels on it, on
    /// threads of their own, and returns at once: a join calls it before reading its right side,
    /// so that the driver's start, the contexts and NVRTC (0.3-0.6 s per process on the H200s
    /// measured) overlap the read. Errors are
    /// left for the build, which meets them again and reports them.
    pub fn warm_up(&self, metric: &Metric) {
        let program = crate::with_semiring!(metric, s => kernels::MetricProgram::of(&s));
        let backend = self.clone();
        let spawned = std::thread::Builder::new()
            .name("sparse-knn-gpu-warm-up".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                // The driver's initialisation (cuInit) is the first and longest step.
                let ordinals = match backend.ordinals() {
                    Ok(o) => o,
                    Err(e) => return log::debug!("GPU warm-up: {e}"),
                };
                log::debug!("GPU: driver ready in {:?}", started.elapsed());
                std::thread::scope(|scope| {
                    for &ordinal in &ordinals {
                        let program = &program;
                        scope.spawn(move || {
                            if let Err(e) = device::compile_ahead(ordinal, program) {
                                log::debug!("GPU {ordinal}: no compile ahead: {e}");
                            }
                        });
                    }
                    for ordinal in ordinals {
                        let program = &program;
                        scope.spawn(move || {
                            match device::device(ordinal).and_then(|d| d.load(program)) {
                                Ok(()) => log::debug!(
                                    "GPU {ordinal}: context and {} kernels ready after {:?}",
                                    program.name,
                                    started.elapsed()
                                ),
                                Err(e) => log::debug!("GPU {ordinal}: warm-up failed: {e}"),
                            }
                        });
                    }
                });
            });
        if let Err(e) = spawned {
            log::debug!("GPU: no warm-up thread: {e}");
        }
    }

    /// The GPUs to use: those of the `gpus` option, or every visible one.
    pub fn ordinals(&self) -> Result<Vec<usize>> {
        // Planning only checked that a driver loads (see `resolve_device`).
        let count = device::device_count().map_err(|e| {
            exec_datafusion_err!(
                "device=gpu but no CUDA GPU can be used: {}; use device=cpu, or device=auto to \
                 fall back to the CPU",
                e.strip_backtrace()
            )
        })?;
        match &self.options.gpus {
            Some(list) => {
                if let Some(&bad) = list.iter().find(|&&g| g >= count) {
                    return exec_err!(
                        "GPU: option gpus names GPU {bad}, but {count} GPU(s) are visible \
                         (ordinals 0 to {})",
                        count - 1
                    );
                }
                Ok(list.clone())
            }
            None => Ok((0..count).collect()),
        }
    }
}

impl GpuIndex {
    /// A probe's pairs with its kernel time and uploads, as one GPU's [`Probed`].
    fn probed(&self, counted: Result<(PairList, GpuStats)>) -> Result<Probed> {
        let (pairs, stats) = counted?;
        let kernel_time = Duration::from_nanos(stats.kernel_nanos);
        Ok(Probed {
            parts: vec![pairs],
            compute_time: kernel_time,
            bytes_to_device: stats.bytes_to_device,
            gpu_times: vec![(self.ordinal(), kernel_time)],
        })
    }
}

impl JoinIndex for GpuIndex {
    fn probe_cancellable(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed> {
        self.probed(self.probe_counted(left, selection, options, cancel))
    }

    /// The folded metrics skip the failing rows in the kernels (the mask folded into the valid
    /// bits); the certified metrics and a k above the kernels' top-k probe for more rows.
    fn probe_masked(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        mask: &RowMask,
        cancel: &Cancel,
    ) -> Result<Probed> {
        if mask.len() != self.rows() {
            return exec_err!(
                "a row mask of {} rows for an index of {} rows",
                mask.len(),
                self.rows()
            );
        }
        if mask.all_pass() || !self.masks_on_device(selection) {
            return probe_masked_by_growing(self, left, selection, options, mask, cancel);
        }
        self.probed(self.probe_counted_masked(left, selection, options, cancel, Some(mask), None))
    }

    /// The folded metrics compare the groups in the kernels: one probe of the whole batch,
    /// every group at once; the others probe group by group.
    fn probe_grouped(
        &self,
        left: &SparseBatch,
        groups: GroupedProbe<'_>,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed> {
        if !self.masks_on_device(selection) || groups.rows != self.rows() {
            return probe_within_groups(self, left, groups, selection, options, cancel);
        }
        self.probed(self.probe_counted_masked(
            left,
            selection,
            options,
            cancel,
            groups.filter,
            Some((groups.left, groups.right_groups())),
        ))
    }

    /// A kernel over the columns the program reads, kept on this GPU after their first upload.
    fn mask_where_kept(
        &self,
        program: &MaskProgram,
        columns: &RecordBatch,
    ) -> Result<Option<BooleanBuffer>> {
        self.mask_on_device(program, columns)
    }

    fn memory_size(&self) -> usize {
        // The right side lives on the device; the host keeps it only when streamed in parts.
        self.host_bytes()
    }

    fn build_bytes_to_device(&self) -> u64 {
        self.stats().bytes_to_device
    }

    /// The folded metrics' block written on the device and copied out once per chunk of left
    /// rows (`index/matrix.rs`); the others, and a right side streamed in parts, by the default
    /// probe within an infinite radius.
    fn distance_matrix(
        &self,
        metric: &Metric,
        left: MatrixRows<'_>,
        out: MatrixOut<'_>,
    ) -> Result<()> {
        self.distance_matrix_on_device(metric, left, out)
    }
}
