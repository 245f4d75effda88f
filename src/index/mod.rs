//! An index that outlives the statement: [`SparseIndex`], a right side read, checked and indexed
//! once, then probed by many left sides, saved to an index file (`.skidx`, `file.rs`) and opened
//! again without a rebuild, and registered as a table (`table.rs`) that `knn_join` /
//! `radius_join` probe through its built index.
//!
//! - `file.rs`: the file format (rows as Arrow IPC, memory-mapped; each metric's CPU index as its
//!   arrays; versioned, every section checksummed).
//! - `table.rs`: [`IndexTable`], the index as a table, and its scan, which the join's build
//!   recognises (`planner/exec/build.rs`) to take the built index instead of building one.
//! - here: the value, the store behind it ([`IndexSource`]: the rows, the metrics served, the
//!   indexes built or loaded so far, each kept for the next probe).

mod cache;
mod file;
mod folder;
mod identity;
mod kept;
mod segments;
mod table;
mod zones;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{exec_err, plan_err, Result};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::prelude::SessionContext;

pub use cache::IndexCache;
pub(crate) use cache::{task_cache, Lookup};
pub use file::FORMAT_VERSION;
pub(crate) use folder::{
    changed_sources, holds_only_index_files, plan_runs, remove_unused, segment_name, Manifest,
    SegmentEntry, WriterLock, MANIFEST,
};
pub(crate) use identity::{identify, FileStamp};
pub(crate) use kept::{KeptSide, KeptVectors};
pub(crate) use segments::{joined, merge_groups, reuse, Part, Run, Segment, Segments};
pub(crate) use table::stored_source;
pub use table::{IndexScanExec, IndexTable};
pub(crate) use zones::{Zones, ZONE_ROWS};

use crate::cpu::CpuIndex;
use crate::device::{resolve_device, Device};
use crate::gpu::{ColumnMap, ColumnProfile, GpuBackend, GpuOptions};
use crate::join::{
    join_shards, max_chunk_nnz, split_row_ranges, split_rows, Cancel, JoinIndex, PairList,
    ProbeOptions, Probed, Selection,
};
use crate::join::{GroupedProbe, MatrixOut, MatrixRows, RowMask};
use crate::metric::Metric;
use crate::options::JoinOptions;
use crate::vector::{find_vector_column, Side};
use crate::vector::{PendingChecks, SparseBatch, VectorCheck};
use file::CpuShards;
use folder::Stored;

/// How a join got its index from an [`IndexSource`] (EXPLAIN ANALYZE: `index_loaded` or
/// `index_built`; one already held counts as reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Obtained {
    Held,
    Loaded,
    Built,
}

/// One index the source holds.
struct Held {
    metric: Metric,
    device: Device,
    /// The GPU options it was built with (GPU indexes only).
    gpu: String,
    index: Arc<dyn JoinIndex>,
}

/// A right side stored once: its rows (all columns), the metrics its indexes serve, and the
/// indexes made so far.
pub struct IndexSource {
    schema: SchemaRef,
    vector_column: String,
    rows: usize,
    served: Vec<Metric>,
    /// The index file or folder it was opened from (its rows and indexes are read on first use).
    file: Option<Stored>,
    batches: OnceLock<Vec<RecordBatch>>,
    /// Every stored row passed the checks (they run once).
    checked: AtomicBool,
    /// The CPU indexes as their shards, kept for saving (built or read from the file).
    cpu: Mutex<Vec<(Metric, CpuShards)>>,
    held: Mutex<Vec<Held>>,
}

impl std::fmt::Debug for IndexSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexSource")
            .field("rows", &self.rows)
            .field("vector_column", &self.vector_column)
            .field("served", &self.served_names())
            .field("file", &self.file.as_ref().map(|f| &f.path))
            .finish()
    }
}

/// A CPU index shared between the source (which saves it) and the joins that probe it.
struct SharedCpuIndex(Arc<CpuIndex>);

impl JoinIndex for SharedCpuIndex {
    fn probe_cancellable(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed> {
        self.0.probe_cancellable(left, selection, options, cancel)
    }

    fn probe_masked(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        mask: &RowMask,
        cancel: &Cancel,
    ) -> Result<Probed> {
        self.0.probe_masked(left, selection, options, mask, cancel)
    }

    fn memory_size(&self) -> usize {
        JoinIndex::memory_size(self.0.as_ref())
    }

    fn distance_matrix(
        &self,
        metric: &Metric,
        left: MatrixRows<'_>,
        out: MatrixOut<'_>,
    ) -> Result<()> {
        self.0.distance_matrix(metric, left, out)
    }

    fn self_nearest(
        &self,
        metric: &Metric,
        rows: &SparseBatch,
        k: usize,
        out: (&mut [f64], &mut [i64]),
    ) -> Result<bool> {
        JoinIndex::self_nearest(self.0.as_ref(), metric, rows, k, out)
    }
}

/// The metric's name with the parameters that shape it, as users write them.
fn describe(metric: &Metric) -> String {
    let mut text = metric.name().to_string();
    if metric.kind == crate::metric::MetricKind::Minkowski {
        text.push_str(&format!(" (p={})", metric.p));
    }
    if let Some(dim) = metric.dim {
        text.push_str(&format!(" (dim={dim})"));
    }
    text
}

/// `metric` with only the parameters that shape its index: `p` for minkowski, `dim` where the
/// metric needs it (elsewhere `dim` only bounds the indices a join accepts).
fn shaping(metric: &Metric) -> Metric {
    let mut m = *metric;
    if m.kind != crate::metric::MetricKind::Minkowski {
        m.p = 2.0;
    }
    if !m.kind.needs_dim() {
        m.dim = None;
    }
    m
}

/// The checks every stored row passes: those of every metric served.
fn vector_check(column: &str, served: &[Metric]) -> VectorCheck {
    let nonnegative = served
        .iter()
        .find(|m| m.kind.needs_nonnegative())
        .map(|m| m.name());
    let dim = served.iter().filter_map(|m| m.dim).min();
    VectorCheck::new(column)
        .with_dim(dim)
        .with_nonnegative_for(nonnegative)
}

impl IndexSource {
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn vector_column(&self) -> &str {
        &self.vector_column
    }

    pub(crate) fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(|f| f.path.as_path())
    }

    pub(crate) fn served_names(&self) -> Vec<String> {
        self.served.iter().map(describe).collect()
    }

    fn what(&self) -> String {
        match &self.file {
            Some(f) => f.describe(),
            None => "the index".to_string(),
        }
    }

    /// The stored rows, all columns (read from the file, memory-mapped, on first use).
    pub(crate) fn batches(&self) -> Result<&[RecordBatch]> {
        if let Some(batches) = self.batches.get() {
            return Ok(batches);
        }
        let file = self
            .file
            .as_ref()
            .expect("a source without rows comes from a file");
        let batches = file.read_batches()?;
        let _ = self.batches.set(batches);
        Ok(self.batches.get().expect("just set"))
    }

    /// The stored vectors, in pieces of at most `max_chunk_nnz()` entries, checked.
    fn pieces(&self) -> Result<Vec<SparseBatch>> {
        let (pieces, checks) = self.unchecked_pieces()?;
        self.run_checks(&pieces, checks)?;
        Ok(pieces)
    }

    /// The rows' checks, once: the rows never change, and a fit's checks ran three times (at
    /// the conversion, when the source was made, and again for its first index).
    fn run_checks(&self, pieces: &[SparseBatch], checks: PendingChecks) -> Result<()> {
        use std::sync::atomic::Ordering;
        if self.checked.load(Ordering::Acquire) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        checks.run(pieces)?;
        self.checked.store(true, Ordering::Release);
        log::debug!("{}: rows checked in {:?}", self.what(), started.elapsed());
        Ok(())
    }

    /// `build` of the stored vectors, run beside their checks: a GPU build only reads the rows
    /// (its kernels pass over what the checks refuse) and spends most of its time copying them
    /// to the device, where the checks of an index file's 11M rows took 0.4 s before it. A
    /// failed check is the answer, and what was built from such rows is dropped.
    fn build_beside_checks<T: Send>(
        &self,
        build: impl FnOnce(Vec<SparseBatch>) -> Result<T> + Send,
    ) -> Result<T> {
        let (pieces, checks) = self.unchecked_pieces()?;
        let (checked, built) = rayon::join(
            || self.run_checks(&pieces, checks),
            || build(pieces.clone()),
        );
        checked?;
        built
    }

    /// The stored vectors in pieces, and the checks they still owe ([`PendingChecks`]): each
    /// batch converted on its own core.
    fn unchecked_pieces(&self) -> Result<(Vec<SparseBatch>, PendingChecks)> {
        use rayon::prelude::*;
        let started = std::time::Instant::now();
        let batches = self.batches()?;
        let read = started.elapsed();
        let column = self.schema.index_of(&self.vector_column)?;
        let check = vector_check(&self.vector_column, &self.served);
        let first_rows: Vec<u64> = batches
            .iter()
            .scan(0u64, |row, b| {
                let first = *row;
                *row += b.num_rows() as u64;
                Some(first)
            })
            .collect();
        let converted: Vec<(Vec<SparseBatch>, PendingChecks)> = batches
            .par_iter()
            .zip(first_rows)
            .map(|(batch, row)| {
                SparseBatch::try_from_array_chunked_unvalidated(
                    batch.column(column).as_ref(),
                    &check.clone().with_first_row(row),
                    max_chunk_nnz(),
                )
            })
            .collect::<Result<_>>()?;
        let (mut pieces, mut checks) = (Vec::new(), PendingChecks::none());
        for (batch_pieces, batch_checks) in converted {
            pieces.extend(batch_pieces);
            checks.extend(batch_checks);
        }
        log::debug!(
            "{}: rows read in {read:?}, converted in {:?}",
            self.what(),
            started.elapsed() - read
        );
        Ok((pieces, checks))
    }

    /// The column profile of each shard (the shards of [`max_chunk_nnz`] entries that a CPU
    /// index and a one-GPU build cut), for an index file: a GPU build from the file then skips
    /// its pass over every entry.
    fn column_profiles(&self) -> Result<Vec<(usize, ColumnProfile)>> {
        let chunks = split_row_ranges(self.pieces()?, max_chunk_nnz());
        Ok(chunks
            .iter()
            .map(|chunk| {
                let rows = chunk.iter().map(SparseBatch::len).sum();
                (rows, ColumnProfile::of(chunk, ColumnMap::of(chunk)))
            })
            .collect())
    }

    /// The error for a metric this source was not built for.
    fn check_served(&self, metric: &Metric) -> Result<()> {
        if self.served.contains(metric) {
            return Ok(());
        }
        exec_err!(
            "{} was built for {}, not for {}: build an index for it (`sparse-knn index --metric \
             {}`), or join the source data instead",
            self.what(),
            self.served_names().join(", "),
            describe(metric),
            metric.name()
        )
    }

    /// `metric`'s CPU index as its shards: read from the file, or built from the rows.
    fn cpu_shards(&self, metric: &Metric) -> Result<(CpuShards, Obtained)> {
        let metric = &shaping(metric);
        let mut cpu = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, shards)) = cpu.iter().find(|(m, _)| m == metric) {
            return Ok((shards.clone(), Obtained::Held));
        }
        let stored = match &self.file {
            Some(file) => file.read_index(metric)?,
            None => None,
        };
        let (shards, how) = match stored {
            Some(shards) => (shards, Obtained::Loaded),
            None => {
                let chunks = split_rows(self.pieces()?, max_chunk_nnz())?;
                let shards = chunks
                    .iter()
                    .map(|c| (c.len(), CpuIndex::build(c, metric)))
                    .collect();
                (shards, Obtained::Built)
            }
        };
        let shards: Vec<(usize, Arc<CpuIndex>)> =
            shards.into_iter().map(|(r, i)| (r, Arc::new(i))).collect();
        cpu.push((*metric, shards.clone()));
        Ok((shards, how))
    }

    /// The index of `metric` on `device`: held already, loaded from the file, or built from the
    /// stored rows (a GPU index: the file holds CPU indexes); kept for the next join.
    pub(crate) fn index_for(
        &self,
        metric: &Metric,
        device: Device,
        gpu: &GpuOptions,
    ) -> Result<(Arc<dyn JoinIndex>, Obtained)> {
        let metric = &shaping(metric);
        self.check_served(metric)?;
        let gpu_shape = match device {
            Device::Cpu => String::new(),
            Device::Gpu => format!("{gpu:?}"),
        };
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = held
            .iter()
            .find(|h| &h.metric == metric && h.device == device && h.gpu == gpu_shape)
        {
            return Ok((Arc::clone(&h.index), Obtained::Held));
        }
        let similarity = metric.kind.is_similarity();
        let (index, how): (Arc<dyn JoinIndex>, Obtained) = match device {
            Device::Cpu => {
                let (shards, how) = self.cpu_shards(metric)?;
                let boxed = shards
                    .into_iter()
                    .map(|(rows, i)| (rows, Box::new(SharedCpuIndex(i)) as Box<dyn JoinIndex>))
                    .collect();
                (Arc::from(join_shards(boxed, similarity, false)?), how)
            }
            Device::Gpu => {
                let backend = GpuBackend {
                    options: gpu.clone(),
                };
                backend.warm_up(metric);
                let profiles = match &self.file {
                    Some(file) => file.read_profiles()?,
                    None => None,
                };
                let index = self.build_beside_checks(|pieces| {
                    backend.build_profiled(pieces, metric, profiles)
                })?;
                (Arc::from(index), Obtained::Built)
            }
        };
        held.push(Held {
            metric: *metric,
            device,
            gpu: gpu_shape,
            index: Arc::clone(&index),
        });
        Ok((index, how))
    }
}

/// A right side indexed once and probed many times (see the module's documentation).
///
/// ```no_run
/// # async fn demo() -> datafusion::common::Result<()> {
/// use datafusion_sparse_knn::index::SparseIndex;
/// let ctx = datafusion_sparse_knn::session_context();
/// let corpus = ctx.read_parquet("data/kos_bow.parquet", Default::default()).await?;
/// let index = SparseIndex::build(corpus, &["cosine"], "").await?;
/// index.save("kos.skidx")?;
/// let queries = ctx.sql("SELECT * FROM 'data/kos_bow.parquet' LIMIT 3").await?;
/// let neighbours = index.knn(queries, 5, "")?.collect().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SparseIndex {
    source: Arc<IndexSource>,
    device: Device,
    gpu: GpuOptions,
}

impl SparseIndex {
    /// Reads `right` (every column), checks its vector column (the one sparse vector column, or
    /// `right_column=` in `options`) and builds its index for each of `metrics` (at least one)
    /// on the `device` of `options` (default: the session's, `auto`). `options` is the SQL
    /// options string: `p`, `dim`, `device`, `gpus`, `right_column`, ...
    pub async fn build(right: DataFrame, metrics: &[&str], options: &str) -> Result<Self> {
        let base = crate::options::session_options(right.task_ctx().session_config().options())?;
        let options = base.apply(options)?;
        let schema = Arc::new(right.schema().as_arrow().clone());
        let batches = right.collect().await?;
        Self::from_batches(schema, batches, metrics, &options)
    }

    /// [`SparseIndex::build`] over batches in memory.
    pub fn from_batches(
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        metrics: &[&str],
        options: &JoinOptions,
    ) -> Result<Self> {
        if metrics.is_empty() {
            return plan_err!("an index needs at least one metric");
        }
        let mut served: Vec<Metric> = Vec::new();
        for name in metrics {
            let metric = shaping(&options.metric(name)?);
            if !served.contains(&metric) {
                served.push(metric);
            }
        }
        let column = find_vector_column(
            "index",
            Side::Right,
            &schema,
            options.right_column.as_deref(),
        )?;
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        if rows > u32::MAX as usize {
            return exec_err!("an index holds at most {} rows, not {rows}", u32::MAX);
        }
        let device = resolve_device("index", options.device)?;
        let gpu = GpuOptions {
            memory_limit: options.gpu_memory_limit,
            gpus: options.gpus.clone(),
            dense_columns: options.dense_columns,
        };
        let source = Arc::new(IndexSource {
            vector_column: schema.field(column).name().clone(),
            schema,
            rows,
            served,
            file: None,
            batches: OnceLock::new(),
            checked: AtomicBool::new(false),
            cpu: Mutex::new(Vec::new()),
            held: Mutex::new(Vec::new()),
        });
        let _ = source.batches.set(batches);
        // Every row is checked now, whatever the device, so that a bad row is an error here.
        source.pieces()?;
        let index = SparseIndex {
            source,
            device,
            gpu,
        };
        for metric in &index.source.served {
            index.source.index_for(metric, device, &index.gpu)?;
        }
        Ok(index)
    }

    /// Opens an index file; its rows and indexes are read (memory-mapped, not rebuilt) when
    /// first probed. Joins run on the CPU unless `options` says otherwise (`device=gpu`).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &JoinOptions::default())
    }

    /// [`SparseIndex::open`] with the options that choose where it is probed.
    pub fn open_with(path: impl AsRef<Path>, options: &JoinOptions) -> Result<Self> {
        let source = Arc::new(IndexSource::open(path.as_ref())?);
        let device = match options.device {
            crate::options::DeviceChoice::Auto => Device::Cpu,
            choice => resolve_device("index", choice)?,
        };
        Ok(SparseIndex {
            source,
            device,
            gpu: GpuOptions {
                memory_limit: options.gpu_memory_limit,
                gpus: options.gpus.clone(),
                dense_columns: options.dense_columns,
            },
        })
    }

    /// Writes the index file: the rows (all columns) and the CPU index of every metric served
    /// (built now for an index held only on a GPU). An existing file is replaced whole.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<u64> {
        let source = &self.source;
        let mut indexes = Vec::new();
        for metric in &source.served {
            indexes.push((*metric, source.cpu_shards(metric)?.0));
        }
        file::write(
            path.as_ref(),
            &source.schema,
            source.batches()?,
            &source.vector_column,
            &indexes,
            &source.column_profiles()?,
        )
    }

    /// Rows indexed.
    pub fn rows(&self) -> usize {
        self.source.rows
    }

    /// The metrics it serves, the first being the one [`SparseIndex::probe`] uses.
    pub fn metrics(&self) -> &[Metric] {
        &self.source.served
    }

    /// The stored rows' schema (every column of the input).
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.source.schema)
    }

    /// The index file it was opened from, if any.
    pub fn path(&self) -> Option<PathBuf> {
        self.source.path().map(Path::to_path_buf)
    }

    /// Where it is probed.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The pairs of `left`'s rows against the index under its first metric, with no DataFusion
    /// plan in between: left row (within `left`), right row (stored order), distance.
    pub fn probe(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
    ) -> Result<PairList> {
        self.probe_metric(&self.source.served[0], left, selection, options)
    }

    /// [`SparseIndex::probe`] under one of the metrics served.
    pub fn probe_metric(
        &self,
        metric: &Metric,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
    ) -> Result<PairList> {
        let (index, _) = self.source.index_for(metric, self.device, &self.gpu)?;
        Ok(index.probe(left, selection, options)?.into_pairs())
    }

    /// [`SparseIndex::probe_metric`] with `within=`: each left row's pairs with the stored rows
    /// of its own group only (`groups.left`: the left rows' groups from
    /// [`crate::join::GroupMembers::left_groups`], `groups.members`: the stored rows' groups), and with the
    /// rows `groups.filter` passes where it is given.
    pub fn probe_grouped_metric(
        &self,
        metric: &Metric,
        left: &SparseBatch,
        groups: GroupedProbe<'_>,
        selection: Selection,
        options: ProbeOptions,
    ) -> Result<PairList> {
        if groups.members.right_rows() != self.rows() || groups.left.len() != left.len() {
            return exec_err!(
                "within: groups of {} stored and {} left rows, for {} and {}",
                groups.members.right_rows(),
                groups.left.len(),
                self.rows(),
                left.len()
            );
        }
        let (index, _) = self.source.index_for(metric, self.device, &self.gpu)?;
        Ok(index
            .probe_grouped(left, groups, selection, options, &Cancel::new())?
            .into_pairs())
    }

    /// Every distance between `left` (None: the stored rows themselves, each pair computed once
    /// where the backend and metric allow) and the stored rows under `metric`, row-major into
    /// `out` (`left` rows × [`SparseIndex::rows`] values): for `dot` the dot product, NaN where
    /// either row is NULL. The backend's own operation ([`JoinIndex::distance_matrix`]): the
    /// CPU's dense blocks, the GPU's matrix kernel, else a probe within an infinite radius.
    pub fn distance_matrix(
        &self,
        metric: &Metric,
        left: Option<&SparseBatch>,
        out: &mut [f64],
    ) -> Result<()> {
        let (index, _) = self.source.index_for(metric, self.device, &self.gpu)?;
        let stored;
        let rows = match left {
            Some(rows) => MatrixRows::Given(rows),
            None => {
                stored = self.stored_rows()?;
                MatrixRows::Own(&stored)
            }
        };
        let out = MatrixOut::new(out, rows.rows().len(), self.rows())?;
        index.distance_matrix(metric, rows, out)
    }

    /// The `k` nearest of every stored row among the stored rows under `metric`, its own pair
    /// left out, into `distances` / `indices` (`k` a row; see [`JoinIndex::self_nearest`]), where
    /// the backend answers it bit for bit as a probe would; `Ok(false)`, nothing written, else.
    pub fn self_nearest(
        &self,
        metric: &Metric,
        k: usize,
        out: (&mut [f64], &mut [i64]),
    ) -> Result<bool> {
        let (index, _) = self.source.index_for(metric, self.device, &self.gpu)?;
        let rows = self.stored_rows()?;
        index.self_nearest(metric, &rows, k, out)
    }

    /// The stored vectors as one batch, as the index was built from them (checked once).
    fn stored_rows(&self) -> Result<SparseBatch> {
        let mut pieces = self.source.pieces()?;
        match pieces.len() {
            1 => Ok(pieces.pop().expect("one piece")),
            _ => SparseBatch::concat(&pieces),
        }
    }

    /// `metric`'s CPU index where it is a single index of every row (held, read or built as a
    /// probe gets it), None on a GPU or where it is in shards: for what a probe does not do
    /// over the whole right side, such as the nearest of its own rows (`cpu::self_nearest`).
    pub fn cpu_index(&self, metric: &Metric) -> Result<Option<Arc<CpuIndex>>> {
        if self.device != Device::Cpu {
            return Ok(None);
        }
        self.source.check_served(&shaping(metric))?;
        let (shards, _) = self.source.cpu_shards(metric)?;
        Ok(match &shards[..] {
            [(_, index)] => Some(Arc::clone(index)),
            _ => None,
        })
    }

    /// The index as a table: register it (`ctx.register_table("corpus", index.table())`) and
    /// `knn_join(q, corpus, ...)` probes this index instead of building one; a plain `SELECT`
    /// reads its rows.
    pub fn table(&self) -> Arc<IndexTable> {
        Arc::new(IndexTable::new(Arc::clone(&self.source)))
    }

    /// The index's rows as a DataFrame of `ctx`.
    pub fn dataframe(&self, ctx: &SessionContext) -> Result<DataFrame> {
        Ok(DataFrame::new(ctx.state(), self.scan_plan()?))
    }

    /// The options that select this index's metric, device and vector column, before `options`.
    pub(crate) fn join_options(&self, metric: &Metric, options: &str) -> String {
        let mut text = format!(
            "device={}, right_column={}",
            self.device, self.source.vector_column
        );
        if metric.kind == crate::metric::MetricKind::Minkowski {
            text.push_str(&format!(", p={}", metric.p));
        }
        if let Some(dim) = metric.dim {
            text.push_str(&format!(", dim={dim}"));
        }
        if !options.trim().is_empty() {
            text.push_str(", ");
            text.push_str(options);
        }
        text
    }

    /// The metric the index serves first (what [`SparseIndex::probe`] and the DataFrame joins
    /// use).
    pub fn first_metric(&self) -> Metric {
        self.source.served[0]
    }

    pub(crate) fn scan_plan(&self) -> Result<datafusion::logical_expr::LogicalPlan> {
        LogicalPlanBuilder::scan("sparse_index", provider_as_source(self.table()), None)?.build()
    }
}

impl IndexSource {
    /// A source over an index file or folder, its headers checked.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = Stored::open(path)?;
        let served = file.metrics.iter().map(shaping).collect();
        Ok(IndexSource {
            schema: Arc::clone(&file.schema),
            vector_column: file.vector_column.clone(),
            rows: file.rows,
            served,
            file: Some(file),
            batches: OnceLock::new(),
            checked: AtomicBool::new(false),
            cpu: Mutex::new(Vec::new()),
            held: Mutex::new(Vec::new()),
        })
    }
}

/// Whether `path` names an index file or folder (by its extension).
pub fn is_index_path(path: &str) -> bool {
    path.trim_end_matches('/')
        .to_ascii_lowercase()
        .ends_with(".skidx")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_saved_index_keeps_its_rows_a_batch_a_shard_and_each_shards_column_profile() {
        let config = datafusion::prelude::SessionConfig::new().with_batch_size(500);
        let ctx = SessionContext::new_with_config(config);
        let right = ctx
            .read_parquet("data/kos_bow.parquet", Default::default())
            .await
            .unwrap();
        let index = SparseIndex::build(right, &["cosine"], "device=cpu")
            .await
            .unwrap();
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("kos.skidx");
        index.save(&path).unwrap();
        let file = file::IndexFile::open(&path).unwrap();
        // Every row in one shard here: one batch, where the Parquet scan gave several.
        assert!(index.source.batches().unwrap().len() > 1);
        assert_eq!(file.read_batches().unwrap().len(), 1);
        let stored = file.read_profiles().unwrap().expect("profiles written");
        assert_eq!(stored, index.source.column_profiles().unwrap());
        assert_eq!(stored[0].0, index.rows());
        // What a GPU build of the stored rows would find in its own pass.
        let opened = SparseIndex::open(&path).unwrap();
        let pieces = opened.source.pieces().unwrap();
        let columns = ColumnMap::of(&pieces);
        assert_eq!(stored[0].1, ColumnProfile::of(&pieces, columns));
    }

    /// A source's rows as a GPU build takes them: the build runs beside the checks, and a
    /// failed check is the answer, not what was built.
    #[test]
    fn a_build_beside_the_checks_answers_with_the_first_failed_check() {
        let rows = |bad_row: Option<usize>| {
            let rows: Vec<Vec<(i32, f32)>> = (0..3000)
                .map(|r| {
                    let value = if Some(r) == bad_row { f32::NAN } else { 1500.0 };
                    vec![(r as i32 % 17, value), (40 + r as i32 % 5, 2.0)]
                })
                .collect();
            let vectors = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
            let column = crate::vector::sparse_vector_field("vec");
            let schema = Arc::new(arrow::datatypes::Schema::new(vec![column]));
            let array = Arc::new(vectors.to_array());
            let batch = RecordBatch::try_new(Arc::clone(&schema), vec![array]).unwrap();
            IndexSource {
                schema,
                vector_column: "vec".into(),
                rows: 3000,
                served: vec![Metric::new("cosine", None, None).unwrap()],
                file: None,
                batches: OnceLock::from(vec![batch]),
                checked: AtomicBool::new(false),
                cpu: Mutex::new(Vec::new()),
                held: Mutex::new(Vec::new()),
            }
        };
        let nnz = |pieces: Vec<SparseBatch>| Ok(pieces.iter().map(SparseBatch::nnz).sum::<usize>());
        assert_eq!(rows(None).build_beside_checks(nnz).unwrap(), 6000);
        let error = rows(Some(2345))
            .build_beside_checks(nnz)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("row 2345") && error.contains("not finite"),
            "{error}"
        );
    }
}
