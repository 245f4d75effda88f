//! The right side of one operator, built once and shared by its output partitions: each input
//! partition read on a task of its own (partition order is row order), its vectors converted on
//! the blocking pool while the scan decodes the next batch, then indexed by the chosen backend
//! (a GPU join's driver, contexts and kernels warm up during the read).

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{BooleanBufferBuilder, RecordBatch};
use arrow::compute::concat_batches;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{exec_err, DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use futures::future::{BoxFuture, FutureExt};
use futures::StreamExt;

use super::Probing;
use super::{inputs_on_own_tasks, key_column};
use crate::cpu::CpuBackend;
use crate::device::Device;
use crate::gpu::{GpuBackend, GpuOptions};
use crate::index::{identify, task_cache, KeptSide, KeptVectors, Lookup};
use crate::join::RowMask;
use crate::join::{max_chunk_nnz, Backend, JoinIndex, KeyGroups};
use crate::options::ExcludeSelf;
use crate::planner::spec::{JoinSpec, Layout};
use crate::vector::SparseBatch;

/// What the blocking build task hands back: the index, the key groups, the right input itself
/// (when kept), the right side's other columns and vectors, the index's memory, the bytes it
/// copied to a device, and the right side's row count.
type BuiltSide = (
    Arc<dyn JoinIndex>,
    Option<KeyGroups>,
    Option<Vec<RecordBatch>>,
    RecordBatch,
    Option<KeptVectors>,
    usize,
    u64,
    usize,
);

pub(super) fn gpu_options(spec: &JoinSpec) -> GpuOptions {
    GpuOptions {
        memory_limit: spec.options.gpu_memory_limit,
        gpus: spec.options.gpus.clone(),
        dense_columns: spec.options.dense_columns,
    }
}

/// One right partition as read: its batches and their vectors, converted where they were valid
/// (None: converted again with the rows' place in the whole side, for the error).
#[derive(Default)]
pub(super) struct ReadPartition {
    pub(super) batches: Vec<RecordBatch>,
    pub(super) pieces: Vec<Option<Vec<SparseBatch>>>,
}

/// Counters of the build, shown once per operator.
pub(super) struct BuildMetrics {
    pub(super) rows: Count,
    /// Reading the right side (and converting its vectors), until the last partition is in.
    pub(super) read_time: Time,
    pub(super) time: Time,
    pub(super) memory: Gauge,
    pub(super) bytes_to_device: Count,
    /// Row ranges indexed separately: more than one past 2^31 entries or over several GPUs.
    pub(super) shards: Count,
    /// 1 when this operator built its right side, when it took one from the index cache (or
    /// one an index value held), and when it read one from an index file.
    pub(super) built: Count,
    pub(super) reused: Count,
    pub(super) loaded: Count,
    /// A filtered right side over a kept index: the rows its filter passed, and the time its
    /// mask took (the predicate over the kept columns, or a read of the columns it needs).
    pub(super) rows_passed: Count,
    pub(super) mask_time: Time,
    /// 1 when the mask was computed where the index is kept (a GPU's kernel), not on the host.
    pub(super) masks_where_kept: Count,
    /// The rows this statement read and indexed (all of them for a build, none for a side taken
    /// from the cache, the new files' rows for a side that grew), and the side's segments.
    pub(super) rows_indexed: Count,
    pub(super) segments: Gauge,
}

impl BuildMetrics {
    pub(super) fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        Self {
            rows: MetricBuilder::new(metrics).global_counter("build_rows"),
            read_time: MetricBuilder::new(metrics).subset_time("build_read_time", 0),
            time: MetricBuilder::new(metrics).subset_time("build_time", 0),
            memory: MetricBuilder::new(metrics).global_gauge("build_mem_used"),
            bytes_to_device: MetricBuilder::new(metrics).global_counter("build_bytes_to_device"),
            shards: MetricBuilder::new(metrics).global_counter("build_shards"),
            built: MetricBuilder::new(metrics).global_counter("index_built"),
            reused: MetricBuilder::new(metrics).global_counter("index_reused"),
            loaded: MetricBuilder::new(metrics).global_counter("index_loaded"),
            rows_passed: MetricBuilder::new(metrics).global_counter("rows_passed"),
            mask_time: MetricBuilder::new(metrics).subset_time("mask_time", 0),
            masks_where_kept: MetricBuilder::new(metrics).global_counter("mask_on_device"),
            rows_indexed: MetricBuilder::new(metrics).global_counter("rows_indexed"),
            segments: MetricBuilder::new(metrics).global_gauge("index_segments"),
        }
    }
}

pub(super) struct BuildJob {
    /// Told when the right side is read (the left read-ahead waits for it).
    pub(super) right_read: Option<futures::channel::oneshot::Sender<()>>,
    /// Keep the right input's batches (all columns) to probe them against the index.
    pub(super) keep_input: bool,
    pub(super) name: &'static str,
    pub(super) spec: Arc<JoinSpec>,
    pub(super) device: Device,
    pub(super) right: Arc<dyn ExecutionPlan>,
    /// The filter's mask plan of a filtered right side (see `SparseJoinExec`).
    pub(super) right_mask: Option<Arc<dyn ExecutionPlan>>,
    /// The filter over the kept side's other columns, where it reads only those.
    pub(super) mask_over_kept: Option<Arc<dyn PhysicalExpr>>,
    pub(super) layout: Layout,
    pub(super) context: Arc<TaskContext>,
    pub(super) metrics: BuildMetrics,
}

impl BuildJob {
    /// The right side from the index cache when it holds one of the same identity, else built
    /// (and kept there when the session has a cache).
    pub(super) async fn run(mut self) -> Result<Arc<Probing>> {
        let mask_plan = self.right_mask.take();
        let over_kept = self.mask_over_kept.take();
        let (context, name) = (Arc::clone(&self.context), self.name);
        let passed = self.metrics.rows_passed.clone();
        let mask_time = self.metrics.mask_time.clone();
        let started = std::time::Instant::now();
        let side = self.kept_side().await?;
        let kept_after = started.elapsed();
        self.metrics.segments.set(side.segments.len().max(1));
        let mask = match mask_plan {
            None => None,
            Some(plan) => {
                let _timer = mask_time.timer();
                let mask = match over_kept {
                    Some(predicate) if side.others.num_rows() == side.rows => {
                        let side = Arc::clone(&side);
                        let where_kept = self.metrics.masks_where_kept.clone();
                        SpawnedTask::spawn_blocking(move || {
                            let (bits, on_device) =
                                super::kept_left::kept_side_passing(&predicate, &side, name)?;
                            where_kept.add(on_device as usize);
                            Ok::<_, DataFusionError>(RowMask::from_bits(bits))
                        })
                        .await
                        .map_err(|e| DataFusionError::External(Box::new(e)))??
                    }
                    _ => read_mask(plan, &context, side.rows, name).await?,
                };
                passed.add(mask.passing());
                log::debug!(
                    "{name}: the right side in {kept_after:?}, its mask ({} of {} rows pass) in {:?}",
                    mask.passing(),
                    mask.len(),
                    started.elapsed() - kept_after
                );
                Some(mask)
            }
        };
        let within = match self.spec.options.within.clone() {
            None => None,
            Some(column) => {
                let at = key_column(&self.right.schema(), "within", &column, "right")?;
                let Some(at) = self.layout.right_others.iter().position(|&c| c == at) else {
                    return exec_err!(
                        "{name}: within={column}: the right side keeps no such column"
                    );
                };
                let side = Arc::clone(&side);
                // A pass over the column (once per kept side), off the async threads.
                Some(
                    SpawnedTask::spawn_blocking(move || side.groups_of(at))
                        .await
                        .map_err(|e| DataFusionError::External(Box::new(e)))??,
                )
            }
        };
        Ok(Arc::new(Probing { side, mask, within }))
    }

    async fn kept_side(&mut self) -> Result<Arc<KeptSide>> {
        let cache = task_cache(&self.context, self.spec.options.index_cache);
        let identity = match &cache {
            Some(_) => identify(&self.right, &self.context, self.index_shape()).await?,
            None => None,
        };
        let (Some((cache, bound)), Some(identity)) = (cache, identity) else {
            return self.build().await.map(Arc::new);
        };
        loop {
            let claim = match cache.lookup(&identity.key) {
                Lookup::Hit(side) => return Ok(self.reused(side)),
                // Polled in place (datafusion-python), the build in flight may be driven only by a
                // stream that is not polled while this one waits: build here instead.
                Lookup::Wait(_) if !inputs_on_own_tasks() => {
                    return self.build().await.map(Arc::new);
                }
                Lookup::Wait(in_flight) => {
                    if let Ok(Some(side)) = in_flight.await {
                        cache.count_hit();
                        return Ok(self.reused(side));
                    }
                    // That build failed or was dropped: look again (and maybe build).
                    continue;
                }
                Lookup::Build(claim) => claim,
            };
            let runs = super::grow::FileRuns::of(
                &self.right,
                identity.key.files(),
                identity.key.build(),
                &self.spec.options.exclude_self,
            );
            let Some(runs) = runs else {
                let side = Arc::new(self.build().await?);
                claim.finish(&side, identity.pinned, bound);
                return Ok(side);
            };
            let (side, segments) = self
                .build_in_segments(&cache, &runs, identity.key.files())
                .await?;
            claim.finish_segmented(&side, Arc::clone(&segments), bound);
            self.merge_later(cache, segments.shape.clone());
            return Ok(side);
        }
    }

    /// A side taken from the cache: counted, and the left read-ahead let go.
    fn reused(&mut self, side: Arc<KeptSide>) -> Arc<KeptSide> {
        log::debug!(
            "{}: the right side's index reused from the cache",
            self.name
        );
        self.metrics.reused.add(1);
        self.metrics.rows.add(side.rows);
        if let Some(read) = self.right_read.take() {
            let _ = read.send(());
        }
        side
    }

    /// What shapes the index besides the right side's rows: two builds with the same shape over
    /// the same data are the same, bit for bit.
    fn index_shape(&self) -> String {
        let options = &self.spec.options;
        let key_column = match &options.exclude_self {
            ExcludeSelf::Column(c) => Some(c.as_str()),
            _ => None,
        };
        format!(
            "metric={:?} device={} gpus={:?} gpu_memory_limit={:?} dense_columns={:?} \
             vector={} others={:?} keep_input={} key_column={key_column:?} max_chunk_nnz={}",
            self.spec.metric,
            self.device,
            options.gpus,
            options.gpu_memory_limit,
            options.dense_columns,
            self.layout.right_vector,
            self.layout.right_others,
            self.keep_input,
            max_chunk_nnz(),
        )
    }

    /// The index an index store under the right input holds or loads for this join (None when
    /// the right input is no such store, or reads its vectors from another column).
    async fn stored_index(
        &self,
        right: &Arc<dyn ExecutionPlan>,
    ) -> Result<Option<Arc<dyn JoinIndex>>> {
        let Some(source) = crate::index::stored_source(crate::planner::gathered(right)) else {
            return Ok(None);
        };
        let schema = right.schema();
        if schema.field(self.layout.right_vector).name() != source.vector_column() {
            return Ok(None);
        }
        let (metric, device, gpu) = (self.spec.metric, self.device, gpu_options(&self.spec));
        let (index, how) =
            SpawnedTask::spawn_blocking(move || source.index_for(&metric, device, &gpu))
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?
                .map_err(|e| e.context(format!("{}: the right side's index", self.name)))?;
        match how {
            crate::index::Obtained::Loaded => self.metrics.loaded.add(1),
            crate::index::Obtained::Held => self.metrics.reused.add(1),
            crate::index::Obtained::Built => self.metrics.built.add(1),
        }
        Ok(Some(index))
    }

    /// The side of the right input, read and built whole.
    pub(super) async fn build(&mut self) -> Result<KeptSide> {
        let right = Arc::clone(&self.right);
        self.build_from(right).await
    }

    /// The side of `right`: the right input, or it restricted to some of its files (a segment).
    pub(super) async fn build_from(&mut self, right: Arc<dyn ExecutionPlan>) -> Result<KeptSide> {
        let stored = self.stored_index(&right).await?;
        if stored.is_none() {
            self.metrics.built.add(1);
        }
        let convert = stored.is_none();
        let reservation = Arc::new(
            MemoryConsumer::new(format!("{}[build side]", self.name))
                .register(self.context.memory_pool()),
        );
        // The gathered input's own partitions, read side by side below and kept in order.
        let source = Arc::clone(crate::planner::gather::gathered(&right));
        let partitions = source.output_partitioning().partition_count();
        let in_order = crate::planner::gather::in_file_order(&self.context);
        let started = Instant::now();
        // The driver starts, the GPUs open their contexts and the metric's kernels compile
        // while the right side is read (0.3-0.6 s on the H200s measured, which used to come
        // before and after the read).
        if self.device == Device::Gpu && convert {
            GpuBackend {
                options: gpu_options(&self.spec),
            }
            .warm_up(&self.spec.metric);
        }
        let right_schema = right.schema();
        let vector_name = right_schema.field(self.layout.right_vector).name().clone();
        // Each partition is read (and its vectors converted) on a task of its own: polled from
        // this one task, a file scan decodes one partition at a time. Partitions stay in
        // partition order: that order is the right side's row order, which breaks ties and
        // defines exclude_self's row positions.
        let reading: Vec<BoxFuture<'static, Result<ReadPartition>>> = (0..partitions)
            .map(|p| {
                let stream = source.execute(p, Arc::clone(&in_order));
                let reservation = Arc::clone(&reservation);
                let check = self.spec.vector_check(&vector_name);
                let vector = self.layout.right_vector;
                async move {
                    let mut stream = stream?;
                    let mut read = ReadPartition::default();
                    let mut converting = Vec::new();
                    let mut row = 0u64;
                    while let Some(batch) = stream.next().await {
                        let batch = batch?;
                        reservation.try_grow(batch.get_array_memory_size())?;
                        // Converted on the blocking pool while the scan decodes the next batch
                        // (a file's row groups are its scan's only parallelism: 5 partitions
                        // of 32 read the movielens file). Row numbers count from this
                        // partition's start; a batch that fails is converted again below,
                        // where its rows have their place in the whole side, so that the error
                        // names the right row.
                        let array = Arc::clone(batch.column(vector));
                        let check = check.clone().with_first_row(row);
                        if convert {
                            converting.push(SpawnedTask::spawn_blocking(move || {
                                SparseBatch::try_from_array_chunked(
                                    array.as_ref(),
                                    &check,
                                    max_chunk_nnz(),
                                )
                                .ok()
                            }));
                        }
                        row += batch.num_rows() as u64;
                        read.batches.push(batch);
                    }
                    for task in converting {
                        read.pieces.push(
                            task.join()
                                .await
                                .map_err(|e| DataFusionError::External(Box::new(e)))?,
                        );
                    }
                    Ok(read)
                }
                .boxed()
            })
            .collect();
        let mut batches: Vec<RecordBatch> = Vec::new();
        let mut converted: Vec<Option<Vec<SparseBatch>>> = Vec::new();
        let partitions_read: Vec<Result<ReadPartition>> = if inputs_on_own_tasks() {
            let tasks: Vec<_> = reading.into_iter().map(SpawnedTask::spawn).collect();
            let mut read = Vec::with_capacity(tasks.len());
            for task in tasks {
                read.push(
                    task.join()
                        .await
                        .map_err(|e| DataFusionError::External(Box::new(e)))?,
                );
            }
            read
        } else {
            futures::future::try_join_all(reading)
                .await
                .map_err(|e| self.resource_hint(e))?
                .into_iter()
                .map(Ok)
                .collect()
        };
        for read in partitions_read {
            let read = read.map_err(|e| self.resource_hint(e))?;
            batches.extend(read.batches);
            converted.extend(read.pieces);
        }
        self.metrics.read_time.add_duration(started.elapsed());
        log::debug!(
            "{}: read the right side ({} batches) in {:?}",
            self.name,
            batches.len(),
            started.elapsed()
        );
        if let Some(read) = self.right_read.take() {
            let _ = read.send(());
        }

        let started = Instant::now();
        let (spec, device, layout, name, keep_input) = (
            Arc::clone(&self.spec),
            self.device,
            self.layout.clone(),
            self.name,
            self.keep_input,
        );
        let metrics = &self.metrics;
        let right_key = match &spec.options.exclude_self {
            ExcludeSelf::Column(c) => Some(key_column(&right_schema, "exclude_self", c, "right")?),
            _ => None,
        };
        let built = SpawnedTask::spawn_blocking(move || -> Result<BuiltSide> {
            let check = spec.vector_check(&vector_name);
            // Pieces of at most max_chunk_nnz() entries; the backend cuts them into shards.
            let mut pieces = Vec::with_capacity(batches.len());
            let mut row = 0u64;
            // A stored index needs no pieces: its vectors were converted and checked when it
            // was built.
            let converted = if convert { converted } else { Vec::new() };
            for (batch, done) in batches.iter().zip(converted) {
                match done {
                    Some(done) => pieces.extend(done),
                    None => pieces.extend(SparseBatch::try_from_array_chunked(
                        batch.column(layout.right_vector).as_ref(),
                        &check.clone().with_first_row(row),
                        max_chunk_nnz(),
                    )?),
                }
                row += batch.num_rows() as u64;
            }
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            let others_schema = Arc::new(right_schema.project(&layout.right_others)?);
            let projected = batches
                .iter()
                .map(|b| b.project(&layout.right_others))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let others = concat_batches(&others_schema, &projected)?;
            let input = keep_input.then(|| batches.clone());
            // The vectors as read, for a left side that picks rows of the same source by its
            // other columns (a lookup by key); not where the side has no other column or keeps
            // its input whole anyway.
            let vectors = (!keep_input && !layout.right_others.is_empty()).then(|| {
                KeptVectors::new(
                    batches
                        .iter()
                        .map(|b| Arc::clone(b.column(layout.right_vector)))
                        .collect(),
                )
            });
            let key_groups = match right_key {
                Some(i) => {
                    let keys: Vec<&dyn arrow::array::Array> =
                        batches.iter().map(|b| b.column(i).as_ref()).collect();
                    let keys = if keys.is_empty() {
                        arrow::array::new_empty_array(right_schema.field(i).data_type())
                    } else {
                        arrow::compute::concat(&keys)?
                    };
                    Some(KeyGroups::build(&keys)?)
                }
                None => None,
            };
            drop(batches);
            if rows > u32::MAX as usize {
                return exec_err!(
                    "{name}: the right side has {rows} rows; at most {} are supported",
                    u32::MAX
                );
            }
            let index: Arc<dyn JoinIndex> = match stored {
                Some(index) => index,
                None => {
                    let backend: Box<dyn Backend> = match device {
                        Device::Cpu => Box::new(CpuBackend),
                        Device::Gpu => Box::new(GpuBackend {
                            options: gpu_options(&spec),
                        }),
                    };
                    Arc::from(backend.build_pieces(pieces, &spec.metric)?)
                }
            };
            let size = index.memory_size()
                + key_groups.as_ref().map_or(0, |g| g.memory_size())
                + input.as_ref().map_or(0, |bs| {
                    bs.iter().map(RecordBatch::get_array_memory_size).sum()
                });
            let bytes = index.build_bytes_to_device();
            Ok((index, key_groups, input, others, vectors, size, bytes, rows))
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))??;
        let (index, key_groups, input, others, mut vectors, index_size, bytes, rows) = built;
        // The raw batches are gone; what stays is the index, the other right columns and the
        // vectors as read, these last only where the pool has room for them (they serve lookups
        // by key; the index does not need them).
        let mut retained = index_size + others.get_array_memory_size();
        if let Some(kept) = &vectors {
            if reservation
                .try_resize(retained + kept.memory_size())
                .is_ok()
            {
                retained += kept.memory_size();
            } else {
                log::info!(
                    "{name}: the session's memory pool has no room for the right side's vectors \
                     ({} bytes): a left side filtering the same source will read it again",
                    kept.memory_size()
                );
                vectors = None;
            }
        }
        reservation.try_resize(retained).map_err(|e| {
            let reason = match e {
                DataFusionError::ResourcesExhausted(m) => m,
                e => e.to_string(),
            };
            DataFusionError::ResourcesExhausted(format!(
                "{name}: the right side's index needs {retained} bytes of session memory: \
                 {reason}; raise the memory limit or join a smaller right side"
            ))
        })?;
        metrics.rows.add(rows);
        metrics.rows_indexed.add(rows);
        metrics.time.add_duration(started.elapsed());
        metrics.memory.set(retained);
        metrics.bytes_to_device.add(bytes as usize);
        metrics.shards.add(index.shards());
        log::debug!(
            "{name}: built the right side ({rows} rows) on the {device} in {:?}",
            started.elapsed()
        );
        Ok(KeptSide {
            index,
            rows,
            input,
            key_groups,
            others,
            vectors,
            host_bytes: retained,
            device_bytes: bytes as usize,
            _reservation: reservation,
            within_groups: Default::default(),
            segments: Vec::new(),
            zones: Default::default(),
        })
    }

    fn resource_hint(&self, e: DataFusionError) -> DataFusionError {
        match e {
            DataFusionError::ResourcesExhausted(msg) => {
                DataFusionError::ResourcesExhausted(format!(
                "{}: reading the right side into memory: {msg}; raise the memory limit or join a \
                 smaller right side",
                self.name
            ))
            }
            e => e,
        }
    }
}

/// The rows of a filtered right side's unfiltered input that its filter passes: the mask plan's
/// one Boolean column read whole, in the right input's order (a NULL does not pass). Evaluated
/// for every statement, over the columns the predicate reads; the index is the kept one.
async fn read_mask(
    plan: Arc<dyn ExecutionPlan>,
    context: &Arc<TaskContext>,
    rows: usize,
    name: &str,
) -> Result<RowMask> {
    let in_order = crate::planner::gather::in_file_order(context);
    let batches = datafusion::physical_plan::collect(plan, in_order).await?;
    let mut pass = BooleanBufferBuilder::new(rows);
    for batch in &batches {
        let Some(column) = batch.columns().first() else {
            return exec_err!("{name}: the right side's filter did not give a Boolean column");
        };
        pass.append_buffer(&super::kept_left::passing_bits(
            column.as_ref(),
            name,
            "right",
        )?);
    }
    if pass.len() != rows {
        return exec_err!(
            "{name}: the right side's filter read {} rows where its index holds {rows}; the \
             source changed while the statement ran: run it again",
            pass.len()
        );
    }
    Ok(RowMask::from_bits(pass.finish()))
}
