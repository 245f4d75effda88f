//! The physical operator: builds the right side once (CPU inverted index or GPU-resident CSR),
//! then streams the left side batch by batch through the probe.
//!
//! One struct serves both functions; it names itself `KnnJoinExec` or `RadiusJoinExec`.
//!
//! - this file: the operator (planning properties, display, `execute`'s wiring of one output
//!   partition: the left input, its read-ahead, the probe job);
//! - `build.rs`: the right side read partition by partition, converted, and indexed once per
//!   operator, shared by every output partition;
//! - `stream.rs`: the probe stream of one output partition (left batches gathered into probes,
//!   sliced by the pairs they may make, two probes in flight, output cut to the batch size);
//! - `probe.rs`: one probe on the blocking pool, its metrics and its memory;
//! - `output.rs`: pairs to the output columns.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
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
use super::spec::{JoinKind, JoinSpec, Layout};
use crate::device::Device;
use crate::join::{Cancel, CancelOnDrop};
use crate::options::{DeviceChoice, ExcludeSelf};

mod build;
mod grow;
mod kept_left;
mod output;
mod probe;
mod stream;

use crate::index::KeptSide;
use crate::join::{GroupMembers, RowMask};
use build::{BuildJob, BuildMetrics};
pub(crate) use grow::{plan_of_files, scan_files};
pub use kept_left::LeftFromKept;
use probe::ProbeJob;

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
    Shared<BoxFuture<'static, std::result::Result<Arc<Probing>, Arc<DataFusionError>>>>;

/// What a statement probes: the kept side (built, or taken from the cache or an index file)
/// and, for a filtered right side over it, the rows the filter passes.
pub(super) struct Probing {
    pub(super) side: Arc<KeptSide>,
    pub(super) mask: Option<RowMask>,
    /// `within=COLUMN`: the right rows' groups.
    pub(super) within: Option<Arc<GroupMembers>>,
}

impl std::ops::Deref for Probing {
    type Target = KeptSide;

    fn deref(&self) -> &KeptSide {
        &self.side
    }
}

/// Resolves once the right side is read (or its build is over, read or not).
type RightRead = Shared<futures::channel::oneshot::Receiver<()>>;

/// `knn_join` / `radius_join` as an execution plan.
pub struct SparseJoinExec {
    spec: Arc<JoinSpec>,
    device: Device,
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    /// A filtered right side over a kept index (`planner/filtered.rs`): one Boolean column, a
    /// row of the unfiltered right input each, read in the right input's order. `right` is
    /// then the unfiltered input, whose index is built once and kept.
    right_mask: Option<Arc<dyn ExecutionPlan>>,
    /// The same predicate over the right side's other columns, where it reads only those: the
    /// kept side holds them, so the mask needs no scan (`right_mask` is what a cluster executor
    /// runs: this expression does not travel).
    mask_over_kept: Option<Arc<dyn PhysicalExpr>>,
    /// A left input that filters the right side's own source (`planner/kept_left.rs`): its
    /// rows are taken from the kept side where it holds its vectors, else the left input is read.
    left_from_kept: Option<Arc<LeftFromKept>>,
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
        Self::try_new_masked(spec, device, left, right, None, left_vector, right_vector)
    }

    /// [`SparseJoinExec::try_new`] over an unfiltered right input whose rows `right_mask`
    /// passes or not (see `planner/filtered.rs`).
    pub fn try_new_masked(
        spec: Arc<JoinSpec>,
        device: Device,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
        right_mask: Option<Arc<dyn ExecutionPlan>>,
        left_vector: &str,
        right_vector: &str,
    ) -> Result<Self> {
        // Inputs read whole, as one partition in partition order (see `gather::gather`).
        let right = super::gather::gather(right);
        let right_mask = right_mask.map(super::gather::gather);
        let left = if spec.options.exclude_self.by_identity() {
            super::gather::gather(left)
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
            right_mask,
            mask_over_kept: None,
            left_from_kept: None,
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

    /// With `predicate` over the right side's other columns (see `planner/filtered.rs`).
    pub fn with_mask_over_kept(mut self, predicate: Option<Arc<dyn PhysicalExpr>>) -> Self {
        if self.right_mask.is_some() {
            self.mask_over_kept = predicate;
        }
        self
    }

    /// With a left input whose rows the kept side can give (see `planner/kept_left.rs`).
    pub fn with_left_from_kept(mut self, left: Option<Arc<LeftFromKept>>) -> Self {
        if !self.spec.options.exclude_self.by_identity() {
            self.left_from_kept = left;
        }
        self
    }

    /// The filter's mask of a filtered right side over a kept index.
    pub fn right_mask(&self) -> Option<&Arc<dyn ExecutionPlan>> {
        self.right_mask.as_ref()
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
        right_mask: Option<Arc<dyn ExecutionPlan>>,
    ) -> Result<Self> {
        Ok(Self::try_new_masked(
            Arc::clone(&self.spec),
            self.device,
            left,
            right,
            right_mask,
            &Self::vector_name(&self.left, self.layout.left_vector),
            &Self::vector_name(&self.right, self.layout.right_vector),
        )?
        .with_mask_over_kept(self.mask_over_kept.clone())
        .with_left_from_kept(self.left_from_kept.clone()))
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
            right_mask: self.right_mask.clone(),
            mask_over_kept: self.mask_over_kept.clone(),
            layout: self.layout.clone(),
            context: Arc::clone(context),
            metrics: BuildMetrics::new(&self.metrics),
        };
        // On a task of its own where the host allows it: a build that other statements wait for
        // (the index cache's one build in flight) must go on whichever stream is polled.
        let build = async move {
            if inputs_on_own_tasks() {
                SpawnedTask::spawn(job.run())
                    .join()
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))
                    .and_then(|built| built)
                    .map_err(Arc::new)
            } else {
                job.run().await.map_err(Arc::new)
            }
        }
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
    /// `, right_filter=mask` for a filtered right side over a kept index (its third input).
    /// and `, left_filter=kept` for a left side taken from the kept side.
    fn mask_label(&self) -> String {
        let mut label = String::new();
        if self.right_mask.is_some() {
            label.push_str(", right_filter=mask");
        }
        if self.left_from_kept.is_some() {
            label.push_str(", left_filter=kept");
        }
        label
    }

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
                "{}: {}, device={}{}{}",
                self.display_name(),
                self.spec,
                self.device,
                self.gpus_label(),
                self.mask_label()
            ),
            DisplayFormatType::Verbose => {
                write!(
                    f,
                    "{}: {}, device={}{}{}",
                    self.display_name(),
                    self.spec,
                    self.device,
                    self.gpus_label(),
                    self.mask_label()
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
        let mut children = vec![&self.left, &self.right];
        children.extend(self.right_mask.as_ref());
        children
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
        let wanted = 2 + usize::from(self.right_mask.is_some());
        if children.len() != wanted {
            return internal_err!(
                "{} takes {wanted} children, got {}",
                self.display_name(),
                children.len()
            );
        }
        let mask = (wanted == 3).then(|| children.pop().expect("three children"));
        let right = children.pop().expect("two children");
        let left = children.pop().expect("two children");
        Ok(Arc::new(self.with_children(left, right, mask)?))
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(self.with_children(
            Arc::clone(&self.left),
            Arc::clone(&self.right),
            self.right_mask.clone(),
        )?))
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        // Each left partition is probed on its own. The inputs read whole (the right side; the
        // left too under exclude_self) are made one partition, in partition order, by
        // `gather::gather` in `try_new` (a planner's CoalescePartitionsExec would lose the row
        // order that exclude_self and ties depend on), and ask for it: so nothing is added by
        // the optimizer, and Ballista gives every task all of them rather than its share.
        let whole = |yes: bool| {
            if yes {
                Distribution::SinglePartition
            } else {
                Distribution::UnspecifiedDistribution
            }
        };
        let mut wanted = vec![
            whole(self.spec.options.exclude_self.by_identity()),
            whole(true),
        ];
        wanted.extend(self.right_mask.as_ref().map(|_| whole(true)));
        wanted
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        // The probe already uses every core per batch.
        vec![false; self.children().len()]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false; self.children().len()]
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
            // A left side the kept side may give is read only where it does not (lazily).
            if reuse_right || !inputs_on_own_tasks() || self.left_from_kept.is_some() {
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
            ExcludeSelf::Column(c) => {
                Some(key_column(&self.left.schema(), "exclude_self", c, "left")?)
            }
            _ => None,
        };
        let left_within = match &self.spec.options.within {
            Some(c) => Some(key_column(&self.left.schema(), "within", c, "left")?),
            None => None,
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
            left_within,
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
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream::probe_stream(stream::StreamParts {
                probe,
                build,
                left_stream,
                reuse_right,
                exclude_self,
                batch_size: context.session_config().batch_size().max(1),
                left_schema: self.left.schema(),
                left_from_kept: self.left_from_kept.clone(),
                left_rows_from_index: MetricBuilder::new(&self.metrics)
                    .counter("left_rows_from_index", partition),
                partition,
                on_drop,
            }),
        )))
    }
}

/// A key column option's column in an input (`exclude_self=COLUMN`, `within=COLUMN`; checked at
/// planning: a plan built another way still gets an error, not a panic).
fn key_column(schema: &Schema, option: &str, column: &str, side: &str) -> Result<usize> {
    exclusion_column(schema, column).ok_or_else(|| {
        DataFusionError::Plan(format!(
            "{option}={column}: the {side} input has no column '{column}'"
        ))
    })
}
