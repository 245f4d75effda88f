//! The physical operator: builds the right side once (CPU inverted index or GPU-resident CSR),
//! then streams the left side batch by batch through the probe.
//!
//! One struct serves both functions; it names itself `KnnJoinExec` or `RadiusJoinExec`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow::array::{
    ArrayRef, Float64Array, Int32Array, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow::compute::{concat_batches, take};
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet,
    RecordOutput, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};

use super::spec::{Device, JoinKind, JoinSpec, Layout};
use crate::cpu::CpuBackend;
use crate::gpu::{GpuBackend, GpuOptions};
use crate::join::{Backend, JoinIndex, PairList, ProbeOptions, Probed};
use crate::vector::SparseBatch;

type SharedBuild =
    Shared<BoxFuture<'static, std::result::Result<Arc<BuildSide>, Arc<DataFusionError>>>>;

/// `knn_join` / `radius_join` as an execution plan.
pub struct SparseJoinExec {
    spec: Arc<JoinSpec>,
    device: Device,
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    layout: Layout,
    schema: SchemaRef,
    /// The right side, built by whichever output partition asks first and shared by all.
    build: Mutex<Option<SharedBuild>>,
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
        let left = if spec.options.exclude_self {
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
        let partitions = if spec.options.exclude_self {
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

    fn shared_build(&self, context: &Arc<TaskContext>) -> SharedBuild {
        let mut slot = self.build.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(build) = slot.as_ref() {
            return build.clone();
        }
        let job = BuildJob {
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
        *slot = Some(build.clone());
        build
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

impl DisplayAs for SparseJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "{}: {}, device={}",
                    self.display_name(),
                    self.spec,
                    self.device
                )
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
        vec![whole(self.spec.options.exclude_self), whole(true)]
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
        let exclude_self = self.spec.options.exclude_self;
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
        let build = self.shared_build(&context);
        let left = Arc::clone(&self.left);
        let ctx = Arc::clone(&context);
        let left_stream = futures::stream::iter(parts)
            .map(move |p| left.execute(p, Arc::clone(&ctx)))
            .try_flatten();

        let probe = ProbeJob {
            spec: Arc::clone(&self.spec),
            layout: self.layout.clone(),
            left_vector: Self::vector_name(&self.left, self.layout.left_vector),
            schema: Arc::clone(&self.schema),
            baseline: BaselineMetrics::new(&self.metrics, partition),
            pairs: MetricBuilder::new(&self.metrics).counter("pairs", partition),
            kernel_time: MetricBuilder::new(&self.metrics).subset_time("kernel_time", partition),
            bytes_to_device: MetricBuilder::new(&self.metrics)
                .counter("bytes_to_device", partition),
        };
        let baseline = probe.baseline.clone();
        let mut next_row: u64 = 0;
        let batch_size = context.session_config().batch_size().max(1);
        let stream = futures::stream::once(async move {
            let build = build.await.map_err(DataFusionError::Shared)?;
            let batches = left_stream
                .map_ok(move |batch| {
                    let first_row = next_row;
                    next_row += batch.num_rows() as u64;
                    (first_row, batch)
                })
                .and_then(move |(first_row, batch)| {
                    let probe = probe.clone();
                    let build = Arc::clone(&build);
                    async move { probe.run(build, batch, first_row, exclude_self).await }
                })
                // A left batch of n rows makes up to n * k pairs: hand them on in slices of the
                // session's batch size (slicing copies nothing).
                .map_ok(move |batch| {
                    let slices = (0..batch.num_rows())
                        .step_by(batch_size)
                        .map(|start| {
                            let slice =
                                batch.slice(start, batch_size.min(batch.num_rows() - start));
                            Ok(slice.record_output(&baseline))
                        })
                        .collect::<Vec<_>>();
                    futures::stream::iter(slices)
                })
                .try_flatten();
            Ok::<_, DataFusionError>(batches)
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// The right side, ready to probe.
struct BuildSide {
    index: Box<dyn JoinIndex>,
    /// The right input's other columns, all rows in order.
    others: RecordBatch,
    _reservation: MemoryReservation,
}

/// What the blocking build task hands back: the index, the right side's other columns, the
/// index's memory, the bytes it copied to a device, and the right side's row count.
type BuiltSide = (Box<dyn JoinIndex>, RecordBatch, usize, u64, usize);

/// Counters of the build, shown once per operator.
struct BuildMetrics {
    rows: Count,
    time: Time,
    memory: Gauge,
    bytes_to_device: Count,
}

impl BuildMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        Self {
            rows: MetricBuilder::new(metrics).global_counter("build_rows"),
            time: MetricBuilder::new(metrics).subset_time("build_time", 0),
            memory: MetricBuilder::new(metrics).global_gauge("build_mem_used"),
            bytes_to_device: MetricBuilder::new(metrics).global_counter("build_bytes_to_device"),
        }
    }
}

struct BuildJob {
    name: &'static str,
    spec: Arc<JoinSpec>,
    device: Device,
    right: Arc<dyn ExecutionPlan>,
    layout: Layout,
    context: Arc<TaskContext>,
    metrics: BuildMetrics,
}

impl BuildJob {
    async fn run(self) -> Result<BuildSide> {
        let reservation = MemoryConsumer::new(format!("{}[build side]", self.name))
            .register(self.context.memory_pool());
        let partitions = self.right.output_partitioning().partition_count();
        // Partitions are read concurrently but kept in partition order: that order is the right
        // side's row order, which breaks ties and defines exclude_self's row positions.
        let reading = (0..partitions).map(|p| {
            let right = Arc::clone(&self.right);
            let context = Arc::clone(&self.context);
            let reservation = &reservation;
            async move {
                let mut stream = right.execute(p, context)?;
                let mut batches = Vec::new();
                while let Some(batch) = stream.next().await {
                    let batch = batch?;
                    reservation.try_grow(batch.get_array_memory_size())?;
                    batches.push(batch);
                }
                Ok::<_, DataFusionError>(batches)
            }
        });
        let batches: Vec<RecordBatch> = futures::future::try_join_all(reading)
            .await
            .map_err(|e| self.resource_hint(e))?
            .into_iter()
            .flatten()
            .collect();

        let started = Instant::now();
        let Self {
            spec,
            device,
            right,
            layout,
            metrics,
            name,
            ..
        } = self;
        let right_schema = right.schema();
        let vector_name = right_schema.field(layout.right_vector).name().clone();
        let built = SpawnedTask::spawn_blocking(move || -> Result<BuiltSide> {
            let check = spec.vector_check(&vector_name);
            let mut vectors = Vec::with_capacity(batches.len());
            let mut row = 0u64;
            for batch in &batches {
                let array = batch.column(layout.right_vector);
                vectors.push(SparseBatch::try_from_array(
                    array.as_ref(),
                    &check.clone().with_first_row(row),
                )?);
                row += batch.num_rows() as u64;
            }
            let vectors = SparseBatch::concat(&vectors)?;
            let others_schema = Arc::new(right_schema.project(&layout.right_others)?);
            let projected = batches
                .iter()
                .map(|b| b.project(&layout.right_others))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let others = concat_batches(&others_schema, &projected)?;
            drop(batches);
            let backend: Box<dyn Backend> = match device {
                Device::Cpu => Box::new(CpuBackend),
                Device::Gpu => Box::new(GpuBackend {
                    options: GpuOptions {
                        memory_limit: spec.options.gpu_memory_limit,
                    },
                }),
            };
            let index = backend.build(&vectors, &spec.metric)?;
            let (size, bytes) = (index.memory_size(), index.build_bytes_to_device());
            Ok((index, others, size, bytes, vectors.len()))
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))??;
        let (index, others, index_size, bytes, rows) = built;
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
        log::debug!(
            "{name}: built the right side ({rows} rows) on the {device} in {:?}",
            started.elapsed()
        );
        Ok(BuildSide {
            index,
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
    layout: Layout,
    left_vector: String,
    schema: SchemaRef,
    baseline: BaselineMetrics,
    pairs: Count,
    kernel_time: Time,
    bytes_to_device: Count,
}

impl ProbeJob {
    async fn run(
        &self,
        build: Arc<BuildSide>,
        batch: RecordBatch,
        first_row: u64,
        exclude_self: bool,
    ) -> Result<RecordBatch> {
        let spec = Arc::clone(&self.spec);
        let vectors = batch.column(self.layout.left_vector).clone();
        let column = self.left_vector.clone();
        let probe_build = Arc::clone(&build);
        let Probed {
            pairs,
            compute_time: kernel,
            bytes_to_device: bytes,
        } = SpawnedTask::spawn_blocking(move || -> Result<Probed> {
            let check = spec.vector_check(&column).with_first_row(first_row);
            let left = SparseBatch::try_from_array(vectors.as_ref(), &check)?;
            let options = ProbeOptions {
                exclude_self_from: exclude_self.then_some(first_row),
            };
            probe_build
                .index
                .probe(&left, spec.kind.selection(), options)
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))??;
        self.kernel_time.add_duration(kernel);
        self.bytes_to_device.add(bytes as usize);

        let _timer = self.baseline.elapsed_compute().timer();
        let out = self.assemble(&build, &batch, pairs)?;
        self.pairs.add(out.num_rows());
        Ok(out)
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
