//! The physical operator: builds the right side once (CPU inverted index or GPU-resident CSR),
//! then streams the left side batch by batch through the probe.
//!
//! One struct serves both functions; it names itself `KnnJoinExec` or `RadiusJoinExec`.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow::array::{
    ArrayRef, Float64Array, Int32Array, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow::compute::{concat_batches, take};
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{exec_err, internal_err, DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet,
    RecordOutput, Time,
};
use datafusion::physical_plan::stream::{
    RecordBatchReceiverStreamBuilder, RecordBatchStreamAdapter,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};

use super::logical::exclusion_column;
use super::spec::{Device, JoinKind, JoinSpec, Layout};
use crate::cpu::CpuBackend;
use crate::gpu::{GpuBackend, GpuOptions};
use crate::join::{
    max_chunk_nnz, Backend, Cancel, CancelOnDrop, JoinIndex, KeyGroups, PairList, ProbeOptions,
    Probed,
};
use crate::options::{DeviceChoice, ExcludeSelf};
use crate::vector::SparseBatch;

/// Pairs one probe may produce at most: a left batch is probed in slices of rows whose pairs
/// (k, or every right row for a radius join) stay below this, so a join that matches everything
/// streams its output slice by slice instead of holding it all (2M pairs: 32 MB of pairs).
const PAIRS_PER_PROBE: usize = 1 << 21;

/// Left rows one probe takes at most (see `execute`).
const PROBE_ROWS: usize = 1 << 16;

/// Whether the operator may poll its inputs on tasks of its own (see [`poll_inputs_in_place`]).
static INPUTS_ON_OWN_TASKS: AtomicBool = AtomicBool::new(true);

fn inputs_on_own_tasks() -> bool {
    INPUTS_ON_OWN_TASKS.load(Ordering::Relaxed)
}

/// From now on, joins of this process poll their inputs only from the task that polls the join
/// (one partition after another within it), never from tasks they spawn. For hosts whose input
/// plans belong to another build of tokio: datafusion-python's scans, reached through
/// datafusion-ffi, abort the process when polled on this crate's runtime threads. Costs the
/// parallel read of the right side and the left side's read-ahead.
pub fn poll_inputs_in_place() {
    INPUTS_ON_OWN_TASKS.store(false, Ordering::Relaxed);
}

/// Left batches read ahead of the probes, per output partition (see `execute`).
const LEFT_READ_AHEAD: usize = 4;

/// Probes of one output partition that run at once (see `execute`).
const PROBES_IN_FLIGHT: usize = 2;

type SharedBuild =
    Shared<BoxFuture<'static, std::result::Result<Arc<BuildSide>, Arc<DataFusionError>>>>;

/// Resolves once the right side is read (or its build is over, read or not).
type RightRead = Shared<futures::channel::oneshot::Receiver<()>>;

/// `knn_join` / `radius_join` as an execution plan.
pub struct SparseJoinExec {
    spec: Arc<JoinSpec>,
    device: Device,
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    layout: Layout,
    schema: SchemaRef,
    /// The right side, built by whichever output partition asks first and shared by all.
    build: Mutex<Option<(SharedBuild, RightRead)>>,
    metrics: ExecutionPlanMetricsSet,
    cache: Arc<PlanProperties>,
}

impl fmt::Debug for SparseJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(self.display_name())
            .field("spec", &self.spec)
            .field("device", &self.device)
            .field("layout", &self.layout)
            .finish()
    }
}

impl SparseJoinExec {
    /// Plans the operator over two physical inputs whose vector columns are named
    /// `left_vector` / `right_vector`; `device` is already resolved.
    pub fn try_new(
        spec: Arc<JoinSpec>,
        device: Device,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
        left_vector: &str,
        right_vector: &str,
    ) -> Result<Self> {
        // Inputs read whole, as one partition in partition order (see `shard::gather`).
        let right = super::shard::gather(right);
        let left = if spec.options.exclude_self.by_identity() {
            super::shard::gather(left)
        } else {
            left
        };
        let layout = physical_layout(
            &spec,
            &left.schema(),
            &right.schema(),
            left_vector,
            right_vector,
        )?;
        let schema = Arc::new(layout.output_schema(&left.schema(), &right.schema()));
        let partitions = if spec.options.exclude_self == ExcludeSelf::Identity {
            1
        } else {
            left.output_partitioning().partition_count()
        };
        let cache = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            spec,
            device,
            left,
            right,
            layout,
            schema,
            build: Mutex::new(None),
            metrics: ExecutionPlanMetricsSet::new(),
            cache: Arc::new(cache),
        })
    }

    pub fn spec(&self) -> &JoinSpec {
        &self.spec
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn left(&self) -> &Arc<dyn ExecutionPlan> {
        &self.left
    }

    pub fn right(&self) -> &Arc<dyn ExecutionPlan> {
        &self.right
    }

    fn display_name(&self) -> &'static str {
        match self.spec.kind {
            JoinKind::Knn { .. } => "KnnJoinExec",
            JoinKind::Radius { .. } => "RadiusJoinExec",
        }
    }

    fn vector_name(plan: &Arc<dyn ExecutionPlan>, index: usize) -> String {
        plan.schema().field(index).name().clone()
    }

    fn with_children(
        &self,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        Self::try_new(
            Arc::clone(&self.spec),
            self.device,
            left,
            right,
            &Self::vector_name(&self.left, self.layout.left_vector),
            &Self::vector_name(&self.right, self.layout.right_vector),
        )
    }

    /// exclude_self=true with both children alike (the logical node gives both the same
    /// columns): the right input is read once and probed against itself.
    fn reads_input_once(&self) -> bool {
        self.spec.options.exclude_self == ExcludeSelf::Identity
            && self.left.schema() == self.right.schema()
            && self.layout.left_vector == self.layout.right_vector
    }

    fn shared_build(&self, context: &Arc<TaskContext>) -> (SharedBuild, RightRead) {
        let mut slot = self.build.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(build) = slot.as_ref() {
            return build.clone();
        }
        let (read, right_read) = futures::channel::oneshot::channel();
        let job = BuildJob {
            right_read: Some(read),
            keep_input: self.reads_input_once(),
            name: self.display_name(),
            spec: Arc::clone(&self.spec),
            device: self.device,
            right: Arc::clone(&self.right),
            layout: self.layout.clone(),
            context: Arc::clone(context),
            metrics: BuildMetrics::new(&self.metrics),
        };
        let build = async move { job.run().await.map(Arc::new).map_err(Arc::new) }
            .boxed()
            .shared();
        let built = (build, right_read.shared());
        *slot = Some(built.clone());
        built
    }
}

/// Finds the vector columns by name in the physical inputs, which have the logical inputs' columns.
fn physical_layout(
    spec: &JoinSpec,
    left: &Schema,
    right: &Schema,
    left_vector: &str,
    right_vector: &str,
) -> Result<Layout> {
    let find =
        |schema: &Schema, name: &str| match schema.fields().iter().position(|f| f.name() == name) {
            Some(i) => Ok(i),
            None => internal_err!(
                "{}: vector column '{name}' is missing from the physical input",
                spec.function_name()
            ),
        };
    let left_vector = find(left, left_vector)?;
    let right_vector = find(right, right_vector)?;
    Ok(Layout::with_vectors(
        spec,
        left,
        right,
        left_vector,
        right_vector,
    ))
}

impl SparseJoinExec {
    /// `, gpus=0,1` when a GPU join was asked for some GPUs (the default is all of them).
    fn gpus_label(&self) -> String {
        match (&self.device, &self.spec.options.gpus) {
            (Device::Gpu, Some(list)) => format!(
                ", gpus={}",
                list.iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            _ => String::new(),
        }
    }
}

impl DisplayAs for SparseJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default => write!(
                f,
                "{}: {}, device={}{}",
                self.display_name(),
                self.spec,
                self.device,
                self.gpus_label()
            ),
            DisplayFormatType::Verbose => {
                write!(
                    f,
                    "{}: {}, device={}{}",
                    self.display_name(),
                    self.spec,
                    self.device,
                    self.gpus_label()
                )?;
                // Why device=auto chose the CPU.
                if self.spec.options.device == DeviceChoice::Auto && self.device == Device::Cpu {
                    if let Some(reason) = crate::gpu::auto_fallback_reason() {
                        write!(f, " (auto: {reason})")?;
                    }
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "metric={}", self.spec.metric)?;
                writeln!(f, "{}", self.spec.kind)?;
                write!(f, "device={}", self.device)
            }
        }
    }
}

impl ExecutionPlan for SparseJoinExec {
    fn name(&self) -> &str {
        self.display_name()
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.left, &self.right]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 2 {
            return internal_err!(
                "{} takes two children, got {}",
                self.display_name(),
                children.len()
            );
        }
        let right = children.pop().expect("two children");
        let left = children.pop().expect("two children");
        Ok(Arc::new(self.with_children(left, right)?))
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(self.with_children(
            Arc::clone(&self.left),
            Arc::clone(&self.right),
        )?))
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        // Each left partition is probed on its own. The inputs read whole (the right side; the
        // left too under exclude_self) are made one partition, in partition order, by
        // `shard::gather` in `try_new` (a planner's CoalescePartitionsExec would lose the row
        // order that exclude_self and ties depend on), and ask for it: so nothing is added by
        // the optimizer, and Ballista gives every task all of them rather than its share.
        let whole = |yes: bool| {
            if yes {
                Distribution::SinglePartition
            } else {
                Distribution::UnspecifiedDistribution
            }
        };
        vec![
            whole(self.spec.options.exclude_self.by_identity()),
            whole(true),
        ]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        // The probe already uses every core per batch.
        vec![false, false]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let left_partitions = self.left.output_partitioning().partition_count();
        let exclude_self = self.spec.options.exclude_self == ExcludeSelf::Identity;
        let parts: Vec<usize> = if exclude_self {
            if partition != 0 {
                return internal_err!(
                    "{} with exclude_self has one partition, asked for {partition}",
                    self.display_name()
                );
            }
            // Row positions must count across the whole left input, in order.
            (0..left_partitions).collect()
        } else {
            vec![partition]
        };
        let (build, right_read) = self.shared_build(&context);
        let left = Arc::clone(&self.left);
        let ctx = Arc::clone(&context);
        let left_stream = futures::stream::iter(parts)
            .map(move |p| left.execute(p, Arc::clone(&ctx)))
            .try_flatten();
        // A self-join with exclude_self=true probes the right side's own rows, read once: two
        // scans of one input need not give the same row order (a folder's files are listed
        // concurrently), and positions are what identify a row.
        let reuse_right = self.reads_input_once();
        let left_stream: futures::stream::BoxStream<'static, Result<RecordBatch>> =
            if reuse_right || !inputs_on_own_tasks() {
                left_stream.boxed()
            } else {
                // The first left batches are read while the right side is built, so that the
                // first probe does not start with a read (~0.1 s at the movielens shape); not
                // while the right side is read: a self-join's two scans of one file shared the
                // cores, and the right side's read is what the build waits for.
                let mut ahead =
                    RecordBatchReceiverStreamBuilder::new(self.left.schema(), LEFT_READ_AHEAD);
                let tx = ahead.tx();
                let mut input = left_stream;
                ahead.spawn(async move {
                    // An error or a dropped build ends the wait as well.
                    let _ = right_read.await;
                    while let Some(batch) = input.next().await {
                        if tx.send(batch).await.is_err() {
                            break;
                        }
                    }
                    Ok(())
                });
                ahead.build().boxed()
            };

        let left_key = match &self.spec.options.exclude_self {
            ExcludeSelf::Column(c) => Some(key_column(&self.left.schema(), c, "left")?),
            _ => None,
        };
        let reservation = Arc::new(
            MemoryConsumer::new(format!("{}[probe {partition}]", self.display_name()))
                .register(context.memory_pool()),
        );
        // Dropping the output stream (LIMIT satisfied, Ctrl-C, a failed sibling) stops the
        // probes it started.
        let cancel = Cancel::new();
        let on_drop = CancelOnDrop(cancel.clone());
        let probe = ProbeJob {
            spec: Arc::clone(&self.spec),
            cancel,
            reservation,
            left_key,
            layout: self.layout.clone(),
            left_vector: Self::vector_name(&self.left, self.layout.left_vector),
            schema: Arc::clone(&self.schema),
            baseline: BaselineMetrics::new(&self.metrics, partition),
            pairs: MetricBuilder::new(&self.metrics).counter("pairs", partition),
            kernel_time: MetricBuilder::new(&self.metrics).subset_time("kernel_time", partition),
            bytes_to_device: MetricBuilder::new(&self.metrics)
                .counter("bytes_to_device", partition),
            gpu_kernel_times: Arc::default(),
            metrics: self.metrics.clone(),
            partition,
        };
        let baseline = probe.baseline.clone();
        let mut next_row: u64 = 0;
        let batch_size = context.session_config().batch_size().max(1);
        let spec = Arc::clone(&self.spec);
        let left_schema = self.left.schema();
        let stream = futures::stream::once(async move {
            let build = build.await.map_err(DataFusionError::Shared)?;
            let per_row = match spec.kind {
                JoinKind::Knn { k } => k.min(build.rows),
                JoinKind::Radius { .. } => build.rows,
            };
            // Left rows per probe, so that one probe's pairs stay near PAIRS_PER_PROBE. A radius
            // join starts from the worst case (every right row within the radius) and, as probes
            // find fewer pairs per row, grows the slice (at most 8x a probe): at 20 rows a probe
            // (100K right rows) the GPU had one block per left row and sat idle.
            let slice_rows = Arc::new(AtomicUsize::new((PAIRS_PER_PROBE / per_row.max(1)).max(1)));
            let grow_slices = matches!(spec.kind, JoinKind::Radius { .. });
            let slice_size = Arc::clone(&slice_rows);
            let left_stream: futures::stream::BoxStream<'static, Result<RecordBatch>> =
                match (&build.input, reuse_right) {
                    (Some(input), true) => {
                        let slices: Vec<Result<RecordBatch>> = input
                            .iter()
                            .flat_map(|b| {
                                (0..b.num_rows())
                                    .step_by(batch_size)
                                    .map(|s| Ok(b.slice(s, batch_size.min(b.num_rows() - s))))
                            })
                            .collect();
                        futures::stream::iter(slices).boxed()
                    }
                    _ => left_stream,
                };
            // Left batches are gathered up to PROBE_ROWS rows (within the pairs a probe may
            // make): GPU launches over one session batch (8,192 rows) end on their few longest
            // rows with most of the device idle (movielens self join on an H200: 2.41 s of
            // kernels in 8,192-row probes, 1.97 s in 64K-row probes).
            // A radius join's slices grow as its probes find how many pairs a row makes, and
            // its gathers with them (a gather fixed at the first slice, a few rows, kept its
            // probes to one session batch).
            let gather_size = Arc::clone(&slice_rows);
            let left_schema = Arc::clone(&left_schema);
            let left_stream = futures::stream::unfold(Some(left_stream), move |input| {
                let left_schema = Arc::clone(&left_schema);
                let gather = PROBE_ROWS.min(gather_size.load(Ordering::Relaxed)).max(1);
                async move {
                    let mut input = input?;
                    let mut pending: Vec<RecordBatch> = Vec::new();
                    let mut rows = 0;
                    let more = loop {
                        match input.next().await {
                            Some(Ok(batch)) => {
                                rows += batch.num_rows();
                                pending.push(batch);
                                if rows >= gather {
                                    break true;
                                }
                            }
                            Some(Err(e)) => return Some((Err(e), None)),
                            None if pending.is_empty() => return None,
                            None => break false,
                        }
                    };
                    let gathered = match pending.len() {
                        1 => Ok(pending.pop().expect("one batch")),
                        _ => concat_batches(&left_schema, &pending).map_err(Into::into),
                    };
                    Some((gathered, more.then_some(input)))
                }
            });
            let batches = left_stream
                .map_ok(move |batch| {
                    let first_row = next_row;
                    next_row += batch.num_rows() as u64;
                    // Cut lazily: each slice takes the size the probes before it left.
                    let slice_rows = Arc::clone(&slice_size);
                    futures::stream::unfold(0usize, move |start| {
                        let batch = batch.clone();
                        let slice_rows = Arc::clone(&slice_rows);
                        async move {
                            (start < batch.num_rows()).then(|| {
                                let len = slice_rows
                                    .load(Ordering::Relaxed)
                                    .min(batch.num_rows() - start);
                                let slice = (first_row + start as u64, batch.slice(start, len));
                                (Ok::<_, DataFusionError>(slice), start + len)
                            })
                        }
                    })
                })
                .try_flatten()
                .map_ok(move |(first_row, batch)| {
                    let probe = probe.clone();
                    let build = Arc::clone(&build);
                    let slice_rows = Arc::clone(&slice_rows);
                    async move {
                        let rows = batch.num_rows();
                        let out = probe.run(build, batch, first_row, exclude_self).await?;
                        if grow_slices {
                            let pairs: usize = out.iter().map(RecordBatch::num_rows).sum();
                            let per_row = pairs.div_ceil(rows.max(1)).max(1);
                            let fits = (PAIRS_PER_PROBE / (2 * per_row)).max(1);
                            // At most 8x the last slice: a few rows predict the next ones'
                            // pairs only roughly (2x took ten probes of a few GPU blocks each
                            // to reach a session batch).
                            slice_rows.store(fits.min(8 * rows.max(1)), Ordering::Relaxed);
                        }
                        Ok(out)
                    }
                })
                // Two probes in flight: one's host work (converting its left rows, merging the
                // GPUs' lists, gathering the output columns) overlaps the other's kernels; the
                // output keeps the left order.
                .try_buffered(PROBES_IN_FLIGHT)
                // A left batch of n rows makes up to n * k pairs: hand them on in slices of the
                // session's batch size (slicing copies nothing).
                .map_ok(move |batches| {
                    let slices = batches
                        .iter()
                        .flat_map(|batch| {
                            (0..batch.num_rows()).step_by(batch_size).map(|start| {
                                batch.slice(start, batch_size.min(batch.num_rows() - start))
                            })
                        })
                        .map(|slice| Ok(slice.record_output(&baseline)))
                        .collect::<Vec<_>>();
                    futures::stream::iter(slices)
                })
                .try_flatten();
            Ok::<_, DataFusionError>(batches)
        })
        .try_flatten()
        .map(move |batch| {
            let _held_until_the_stream_is_dropped = &on_drop;
            batch
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// `exclude_self=COLUMN`'s column in an input (checked at planning; a plan built another way
/// still gets an error, not a panic).
fn key_column(schema: &Schema, column: &str, side: &str) -> Result<usize> {
    exclusion_column(schema, column).ok_or_else(|| {
        DataFusionError::Plan(format!(
            "exclude_self={column}: the {side} input has no column '{column}'"
        ))
    })
}

/// The right side, ready to probe.
struct BuildSide {
    index: Box<dyn JoinIndex>,
    rows: usize,
    /// The right input itself, when the operator probes it against itself (exclude_self=true):
    /// its batches as read (not concatenated: their list offsets may not fit one batch).
    input: Option<Vec<RecordBatch>>,
    /// `exclude_self=COLUMN`: the right rows' key groups.
    key_groups: Option<KeyGroups>,
    /// The right input's other columns, all rows in order.
    others: RecordBatch,
    _reservation: Arc<MemoryReservation>,
}

/// What the blocking build task hands back: the index, the key groups, the right input itself
/// (when kept), the right side's other columns, the index's memory, the bytes it copied to a device, and the right side's row count.
type BuiltSide = (
    Box<dyn JoinIndex>,
    Option<KeyGroups>,
    Option<Vec<RecordBatch>>,
    RecordBatch,
    usize,
    u64,
    usize,
);

fn gpu_options(spec: &JoinSpec) -> GpuOptions {
    GpuOptions {
        memory_limit: spec.options.gpu_memory_limit,
        gpus: spec.options.gpus.clone(),
        dense_columns: spec.options.dense_columns,
    }
}

/// One right partition as read: its batches and their vectors, converted where they were valid
/// (None: converted again with the rows' place in the whole side, for the error).
#[derive(Default)]
struct ReadPartition {
    batches: Vec<RecordBatch>,
    pieces: Vec<Option<Vec<SparseBatch>>>,
}

/// Counters of the build, shown once per operator.
struct BuildMetrics {
    rows: Count,
    /// Reading the right side (and converting its vectors), until the last partition is in.
    read_time: Time,
    time: Time,
    memory: Gauge,
    bytes_to_device: Count,
    /// Row ranges indexed separately: more than one past 2^31 entries or over several GPUs.
    shards: Count,
}

impl BuildMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        Self {
            rows: MetricBuilder::new(metrics).global_counter("build_rows"),
            read_time: MetricBuilder::new(metrics).subset_time("build_read_time", 0),
            time: MetricBuilder::new(metrics).subset_time("build_time", 0),
            memory: MetricBuilder::new(metrics).global_gauge("build_mem_used"),
            bytes_to_device: MetricBuilder::new(metrics).global_counter("build_bytes_to_device"),
            shards: MetricBuilder::new(metrics).global_counter("build_shards"),
        }
    }
}

struct BuildJob {
    /// Told when the right side is read (the left read-ahead waits for it).
    right_read: Option<futures::channel::oneshot::Sender<()>>,
    /// Keep the right input's batches (all columns) to probe them against the index.
    keep_input: bool,
    name: &'static str,
    spec: Arc<JoinSpec>,
    device: Device,
    right: Arc<dyn ExecutionPlan>,
    layout: Layout,
    context: Arc<TaskContext>,
    metrics: BuildMetrics,
}

impl BuildJob {
    async fn run(mut self) -> Result<BuildSide> {
        let reservation = Arc::new(
            MemoryConsumer::new(format!("{}[build side]", self.name))
                .register(self.context.memory_pool()),
        );
        // The gathered input's own partitions, read side by side below and kept in order.
        let source = Arc::clone(super::shard::gathered(&self.right));
        let partitions = source.output_partitioning().partition_count();
        let in_order = super::shard::in_file_order(&self.context);
        let started = Instant::now();
        // The driver starts, the GPUs open their contexts and the metric's kernels compile
        // while the right side is read (0.3-0.6 s on the H200s measured, which used to come
        // before and after the read).
        if self.device == Device::Gpu {
            GpuBackend {
                options: gpu_options(&self.spec),
            }
            .warm_up(&self.spec.metric);
        }
        let right_schema = self.right.schema();
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
                        converting.push(SpawnedTask::spawn_blocking(move || {
                            SparseBatch::try_from_array_chunked(
                                array.as_ref(),
                                &check,
                                max_chunk_nnz(),
                            )
                            .ok()
                        }));
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
        let Self {
            spec,
            device,
            layout,
            metrics,
            name,
            keep_input,
            ..
        } = self;
        let right_key = match &spec.options.exclude_self {
            ExcludeSelf::Column(c) => Some(key_column(&right_schema, c, "right")?),
            _ => None,
        };
        let built = SpawnedTask::spawn_blocking(move || -> Result<BuiltSide> {
            let check = spec.vector_check(&vector_name);
            // Pieces of at most max_chunk_nnz() entries; the backend cuts them into shards.
            let mut pieces = Vec::with_capacity(batches.len());
            let mut row = 0u64;
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
            let rows = row as usize;
            let others_schema = Arc::new(right_schema.project(&layout.right_others)?);
            let projected = batches
                .iter()
                .map(|b| b.project(&layout.right_others))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let others = concat_batches(&others_schema, &projected)?;
            let input = keep_input.then(|| batches.clone());
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
            let backend: Box<dyn Backend> = match device {
                Device::Cpu => Box::new(CpuBackend),
                Device::Gpu => Box::new(GpuBackend {
                    options: gpu_options(&spec),
                }),
            };
            let index = backend.build_pieces(pieces, &spec.metric)?;
            let size = index.memory_size()
                + key_groups.as_ref().map_or(0, |g| g.memory_size())
                + input.as_ref().map_or(0, |bs| {
                    bs.iter().map(RecordBatch::get_array_memory_size).sum()
                });
            let bytes = index.build_bytes_to_device();
            Ok((index, key_groups, input, others, size, bytes, rows))
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))??;
        let (index, key_groups, input, others, index_size, bytes, rows) = built;
        // The raw batches are gone; what stays is the index and the other right columns.
        let retained = index_size + others.get_array_memory_size();
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
        metrics.time.add_duration(started.elapsed());
        metrics.memory.set(retained);
        metrics.bytes_to_device.add(bytes as usize);
        metrics.shards.add(index.shards());
        log::debug!(
            "{name}: built the right side ({rows} rows) on the {device} in {:?}",
            started.elapsed()
        );
        Ok(BuildSide {
            index,
            rows,
            input,
            key_groups,
            others,
            _reservation: reservation,
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

/// Per output partition: probes each left batch and assembles the output batch.
#[derive(Clone)]
struct ProbeJob {
    spec: Arc<JoinSpec>,
    cancel: Cancel,
    /// The pairs of the slice being probed and its output, in the session's memory pool.
    reservation: Arc<MemoryReservation>,
    /// `exclude_self=COLUMN`'s column in the left input.
    left_key: Option<usize>,
    layout: Layout,
    left_vector: String,
    schema: SchemaRef,
    baseline: BaselineMetrics,
    pairs: Count,
    kernel_time: Time,
    bytes_to_device: Count,
    /// `kernel_time_gpu<N>` per GPU that worked for this partition, registered on first use.
    gpu_kernel_times: Arc<Mutex<Vec<(usize, Time)>>>,
    metrics: ExecutionPlanMetricsSet,
    partition: usize,
}

impl ProbeJob {
    fn gpu_time(&self, ordinal: usize) -> Time {
        let mut times = self
            .gpu_kernel_times
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = times.iter().find(|(o, _)| *o == ordinal) {
            return t.clone();
        }
        let t = MetricBuilder::new(&self.metrics)
            .subset_time(format!("kernel_time_gpu{ordinal}"), self.partition);
        times.push((ordinal, t.clone()));
        t
    }

    async fn run(
        &self,
        build: Arc<BuildSide>,
        batch: RecordBatch,
        first_row: u64,
        exclude_self: bool,
    ) -> Result<Vec<RecordBatch>> {
        let spec = Arc::clone(&self.spec);
        let vectors = batch.column(self.layout.left_vector).clone();
        let left_keys = self.left_key.map(|i| batch.column(i).clone());
        let column = self.left_vector.clone();
        let probe_build = Arc::clone(&build);
        let cancel = self.cancel.clone();
        let started = Instant::now();
        let Probed {
            parts,
            compute_time: kernel,
            bytes_to_device: bytes,
            gpu_times,
        } = SpawnedTask::spawn_blocking(move || -> Result<Probed> {
            let check = spec.vector_check(&column).with_first_row(first_row);
            // One piece unless the batch holds more entries than 32-bit offsets address.
            let pieces =
                SparseBatch::try_from_array_chunked(vectors.as_ref(), &check, max_chunk_nnz())?;
            let groups = probe_build.key_groups.as_ref().zip(left_keys);
            let selection = match &groups {
                Some((groups, _)) => groups.widen(spec.kind.selection()),
                None => spec.kind.selection(),
            };
            let mut probed = Probed::default();
            let mut offset = 0usize;
            for left in &pieces {
                let options = ProbeOptions {
                    exclude_self_from: exclude_self.then_some((first_row + offset as u64) as i64),
                };
                let mut piece = probe_build
                    .index
                    .probe_cancellable(left, selection, options, &cancel)?;
                for part in &mut piece.parts {
                    for l in part.left.iter_mut() {
                        *l += offset as u32;
                    }
                }
                let parts = probed.absorb(piece);
                probed.parts.extend(parts);
                offset += left.len();
            }
            if let Some((groups, keys)) = groups {
                // Each part holds whole left rows, which is all the filter looks at.
                let left_groups = groups.left_groups(&keys)?;
                let selection = spec.kind.selection();
                probed.parts = std::mem::take(&mut probed.parts)
                    .into_iter()
                    .map(|part| groups.filter(part, &left_groups, selection))
                    .collect();
            }
            Ok(probed)
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))??;
        log::debug!(
            "{}: probed left rows {first_row}..{} in {:?} (kernels {kernel:?})",
            self.spec.function_name(),
            first_row + batch.num_rows() as u64,
            started.elapsed()
        );
        self.kernel_time.add_duration(kernel);
        self.bytes_to_device.add(bytes as usize);
        for (ordinal, time) in gpu_times {
            self.gpu_time(ordinal).add_duration(time);
        }
        // This probe's own share of the partition's reservation (probes overlap), freed when
        // the batch becomes the consumer's.
        let reservation = self.reservation.new_empty();
        let held = parts.iter().map(PairList::len).sum::<usize>() * 16;
        self.reserve(&reservation, held, batch.num_rows())?;

        let _timer = self.baseline.elapsed_compute().timer();
        // A record batch per part: the parts are handed on without being copied into one.
        let out = parts
            .into_iter()
            .map(|part| self.assemble(&build, &batch, part))
            .collect::<Result<Vec<_>>>()?;
        let (rows, bytes) = out.iter().fold((0, 0), |(r, b), o| {
            (r + o.num_rows(), b + o.get_array_memory_size())
        });
        self.reserve(&reservation, held + bytes, batch.num_rows())?;
        self.pairs.add(rows);
        Ok(out)
    }

    fn reserve(&self, reservation: &MemoryReservation, bytes: usize, rows: usize) -> Result<()> {
        reservation.try_resize(bytes).map_err(|e| {
            let reason = match e {
                DataFusionError::ResourcesExhausted(m) => m,
                e => e.to_string(),
            };
            DataFusionError::ResourcesExhausted(format!(
                "{}: the pairs of {rows} left rows need {bytes} bytes of session memory: \
                 {reason}; raise the memory limit, or ask for fewer pairs (a smaller k or radius)",
                self.spec.function_name()
            ))
        })
    }

    fn assemble(
        &self,
        build: &BuildSide,
        batch: &RecordBatch,
        pairs: PairList,
    ) -> Result<RecordBatch> {
        let ranks = self.layout.with_rank.then(|| pairs.ranks());
        let left_rows = UInt32Array::from(pairs.left);
        let right_rows = UInt32Array::from(pairs.right);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for &i in &self.layout.left_others {
            columns.push(take(batch.column(i).as_ref(), &left_rows, None)?);
        }
        for column in build.others.columns() {
            columns.push(take(column.as_ref(), &right_rows, None)?);
        }
        columns.push(Arc::new(Float64Array::from(pairs.distance)));
        if let Some(ranks) = ranks {
            columns.push(Arc::new(Int32Array::from(ranks)));
        }
        let options = RecordBatchOptions::new().with_row_count(Some(left_rows.len()));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
    }
}
