//! `right_shards=N`: the right side split into N shards (right row `i` goes to shard `i mod N`),
//! each joined with the whole left side as its own operator (its own tasks on a cluster), and
//! the per-shard answers merged per left row.
//!
//! ```text
//! ShardedJoinExec (one output partition per left partition; runs, in each, the plan:)
//!   ShardMergeExec                    per left row: drop self pairs, order by (distance, right
//!     UnionExec                         row), keep k, rank again
//!       KnnJoinExec(ShardExec(left partition p, 0, 1), ShardExec(right, 0, N))
//!       ...
//!       KnnJoinExec(ShardExec(left partition p, 0, 1), ShardExec(right, N-1, N))
//! ```
//!
//! The per-shard plans are built inside the task (a distributed engine sees one operator), and
//! the shards run one after another, so a task holds one shard's index at a time. (A plan with
//! one Ballista stage per shard and a shuffle before the merge was tried: Ballista 55 routed a
//! stage's union of one-partition joins wrongly, duplicating one shard and losing another.)
//!
//! Row ids travel as a hidden column [`ROW_ID`] on both inputs (copied to the join's output as
//! `query___sknn_row` / `neighbor___sknn_row`): global row positions, so the merge breaks ties
//! by the right side's row order exactly as one build does; left ids are positions within the
//! task's left partition (all of the left side under `exclude_self`, so global there). With
//! `exclude_self`, each shard joins without the exclusion and with k + 1, and the merge drops
//! the pairs whose two positions are equal.

use std::fmt;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, AsArray, BooleanArray, Float64Array, Int32Array, RecordBatch, UInt32Array,
    UInt64Array,
};
use arrow::compute::{concat_batches, filter_record_batch, take};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use super::exec::SparseJoinExec;
use super::gather::{gather, one_input_plan, properties};
use super::spec::{JoinKind, JoinSpec, NEIGHBOR_PREFIX, QUERY_PREFIX, RANK_COLUMN};
use crate::device::Device;

/// The hidden row-id column added to both inputs of a sharded join.
pub const ROW_ID: &str = "__sknn_row";

fn with_row_id(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(ROW_ID, DataType::UInt64, false));
    Arc::new(Schema::new(fields))
}

fn append_ids(schema: &SchemaRef, batch: &RecordBatch, ids: UInt64Array) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(ids));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Plans a join with `spec.options.right_shards` > 1 over its physical inputs.
pub fn plan_sharded(
    spec: Arc<JoinSpec>,
    device: Device,
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    left_vector: &str,
    right_vector: &str,
) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(Arc::new(ShardedJoinExec::try_new(
        spec,
        device,
        left,
        right,
        left_vector.to_string(),
        right_vector.to_string(),
    )?))
}

/// A join whose right side is split into `right_shards` shards. Each output partition is one
/// left partition (all of the left side under `exclude_self`), joined with every shard in turn
/// (one shard's index in memory at a time) and merged per left row. The per-shard plans are
/// built when a partition runs, inside its task, so that a distributed engine sees one operator
/// partitioned like the left side.
#[derive(Debug)]
pub struct ShardedJoinExec {
    spec: Arc<JoinSpec>,
    device: Device,
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    left_vector: String,
    right_vector: String,
    schema: SchemaRef,
    cache: Arc<PlanProperties>,
    /// The right side's batches, read once (by the first partition to run) for all partitions.
    right_batches: std::sync::Mutex<Option<SharedBatches>>,
}

type SharedBatches = futures::future::Shared<
    futures::future::BoxFuture<
        'static,
        std::result::Result<Arc<Vec<RecordBatch>>, Arc<DataFusionError>>,
    >,
>;

impl ShardedJoinExec {
    pub fn try_new(
        spec: Arc<JoinSpec>,
        device: Device,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
        left_vector: String,
        right_vector: String,
    ) -> Result<Self> {
        let left = if spec.options.exclude_self.by_identity() {
            gather(left)
        } else {
            left
        };
        let right = gather(right);
        let mut this = Self {
            spec,
            device,
            left,
            right,
            left_vector,
            right_vector,
            schema: Arc::new(Schema::empty()),
            cache: properties(Arc::new(Schema::empty()), 1),
            right_batches: std::sync::Mutex::new(None),
        };
        let left_part: Arc<dyn ExecutionPlan> =
            Arc::new(PartitionExec::new(Arc::clone(&this.left), 0));
        this.schema = this
            .merge_plan(left_part, Arc::clone(&this.right))?
            .schema();
        this.cache = properties(
            Arc::clone(&this.schema),
            this.left.output_partitioning().partition_count(),
        );
        Ok(this)
    }

    pub fn spec(&self) -> &JoinSpec {
        &self.spec
    }

    pub fn vectors(&self) -> (&str, &str) {
        (&self.left_vector, &self.right_vector)
    }

    /// One left partition (`left`, one partition) joined with each shard of `right` (one
    /// partition), under the merge. Both are executed once per shard.
    fn merge_plan(
        &self,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
    ) -> Result<ShardMergeExec> {
        let spec = &self.spec;
        let shards = spec.options.right_shards;
        // Each shard's join: no exclusion (done by the merge on global positions), one more
        // neighbour when the merge may drop a self pair, one shard.
        let kind = match spec.kind {
            JoinKind::Knn { k } => JoinKind::Knn {
                k: k + usize::from(spec.options.exclude_self.by_identity()),
            },
            radius => radius,
        };
        // exclude_self=COLUMN works within each shard's join (it needs no positions);
        // exclude_self=true is done by the merge.
        let exclusion = if spec.options.exclude_self.by_identity() {
            "false".to_string()
        } else {
            spec.options.exclude_self.to_string()
        };
        let source = spec
            .source
            .clone()
            .with_text(format!("exclude_self={exclusion}, right_shards=1"));
        let shard_spec = Arc::new(JoinSpec::parse(kind, spec.metric.name(), source)?);
        let left: Arc<dyn ExecutionPlan> = Arc::new(ShardExec::new(left, 0, 1));
        let joins = (0..shards)
            .map(|shard| {
                let right: Arc<dyn ExecutionPlan> =
                    Arc::new(ShardExec::new(Arc::clone(&right), shard, shards));
                let join = SparseJoinExec::try_new(
                    Arc::clone(&shard_spec),
                    self.device,
                    Arc::clone(&left),
                    right,
                    &self.left_vector,
                    &self.right_vector,
                )?;
                Ok(Arc::new(join) as Arc<dyn ExecutionPlan>)
            })
            .collect::<Result<Vec<_>>>()?;
        ShardMergeExec::try_new(UnionExec::try_new(joins)?, Arc::clone(spec))
    }
}

impl DisplayAs for ShardedJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "{}: {}, device={}, right_shards={}",
            match self.spec.kind {
                JoinKind::Knn { .. } => "ShardedKnnJoinExec",
                JoinKind::Radius { .. } => "ShardedRadiusJoinExec",
            },
            self.spec,
            self.device,
            self.spec.options.right_shards
        )
    }
}

impl ExecutionPlan for ShardedJoinExec {
    fn name(&self) -> &str {
        "ShardedJoinExec"
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
            return internal_err!("ShardedJoinExec takes two children");
        }
        let right = children.pop().expect("two");
        let left = children.pop().expect("two");
        Ok(Arc::new(Self::try_new(
            Arc::clone(&self.spec),
            self.device,
            left,
            right,
            self.left_vector.clone(),
            self.right_vector.clone(),
        )?))
    }

    fn required_input_distribution(&self) -> Vec<datafusion::physical_plan::Distribution> {
        let mut d = whole_input_if(self.spec.options.exclude_self.by_identity());
        d.extend(whole_input_if(true));
        d
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        // The inputs are read once, here, and kept: a plan may not be executed twice (a
        // repartition under it could deal rows differently the second time).
        use futures::FutureExt;
        let left = self.left.execute(partition, Arc::clone(&context))?;
        let right = {
            let mut slot = self.right_batches.lock().unwrap_or_else(|p| p.into_inner());
            match slot.as_ref() {
                Some(shared) => shared.clone(),
                None => {
                    let stream = self.right.execute(0, Arc::clone(&context))?;
                    let shared = async move {
                        let batches: Vec<RecordBatch> = stream.try_collect().await?;
                        Ok(Arc::new(batches))
                    }
                    .map(|r: Result<_>| r.map_err(Arc::new))
                    .boxed()
                    .shared();
                    *slot = Some(shared.clone());
                    shared
                }
            }
        };
        let (left_schema, right_schema) = (self.left.schema(), self.right.schema());
        let this = Self::try_new(
            Arc::clone(&self.spec),
            self.device,
            Arc::clone(&self.left),
            Arc::clone(&self.right),
            self.left_vector.clone(),
            self.right_vector.clone(),
        )?;
        let stream = futures::stream::once(async move {
            let left: Vec<RecordBatch> = left.try_collect().await?;
            let right = right.await.map_err(DataFusionError::Shared)?;
            let right = right.as_ref().clone();
            let left = MemorySourceConfig::try_new_exec(&[left], left_schema, None)?;
            let right = MemorySourceConfig::try_new_exec(&[right], right_schema, None)?;
            let merge = this.merge_plan(left, right)?;
            let union = Arc::clone(&merge.input);
            let in_schema = union.schema();
            // Shard after shard: one shard's index in memory at a time.
            let mut batches = Vec::new();
            for p in 0..union.output_partitioning().partition_count() {
                let part: Vec<RecordBatch> = union
                    .execute(p, Arc::clone(&context))?
                    .try_collect()
                    .await?;
                batches.extend(part);
            }
            let all = concat_batches(&in_schema, &batches)?;
            merge.merge(all)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// One partition of its input, as a one-partition plan.
#[derive(Debug)]
pub struct PartitionExec {
    input: Arc<dyn ExecutionPlan>,
    partition: usize,
    cache: Arc<PlanProperties>,
}

impl PartitionExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, partition: usize) -> Self {
        let cache = properties(input.schema(), 1);
        Self {
            input,
            partition,
            cache,
        }
    }
}

impl DisplayAs for PartitionExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PartitionExec: partition={}", self.partition)
    }
}

impl ExecutionPlan for PartitionExec {
    one_input_plan!("PartitionExec");

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => Ok(Arc::new(Self::new(input, self.partition))),
            _ => internal_err!("PartitionExec takes one child"),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("PartitionExec has one partition, asked for {partition}");
        }
        self.input.execute(self.partition, context)
    }
}

fn whole_input_if(whole: bool) -> Vec<datafusion::physical_plan::Distribution> {
    use datafusion::physical_plan::Distribution;
    vec![if whole {
        Distribution::SinglePartition
    } else {
        Distribution::UnspecifiedDistribution
    }]
}

/// One shard of an input: the rows whose global position `i` (over all partitions, in order)
/// has `i mod shards == shard`, with [`ROW_ID`] = `i`. One output partition. With one shard, it
/// numbers the left side.
#[derive(Debug)]
pub struct ShardExec {
    input: Arc<dyn ExecutionPlan>,
    shard: usize,
    shards: usize,
    schema: SchemaRef,
    cache: Arc<PlanProperties>,
}

impl ShardExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, shard: usize, shards: usize) -> Self {
        let input = gather(input);
        let schema = with_row_id(&input.schema());
        let cache = properties(Arc::clone(&schema), 1);
        Self {
            input,
            shard,
            shards,
            schema,
            cache,
        }
    }

    pub fn shard(&self) -> usize {
        self.shard
    }

    pub fn shards(&self) -> usize {
        self.shards
    }
}

impl DisplayAs for ShardExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ShardExec: shard={} of {}", self.shard, self.shards)
    }
}

impl ExecutionPlan for ShardExec {
    one_input_plan!("ShardExec");

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => {
                Ok(Arc::new(Self::new(input, self.shard, self.shards)))
            }
            _ => internal_err!("ShardExec takes one child"),
        }
    }

    fn required_input_distribution(&self) -> Vec<datafusion::physical_plan::Distribution> {
        whole_input_if(true)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("ShardExec has one partition, asked for {partition}");
        }
        // The input is one partition (`gather`), its partitions in order.
        let schema = Arc::clone(&self.schema);
        let (shard, shards) = (self.shard as u64, self.shards as u64);
        let mut next = 0u64;
        let stream = self.input.execute(0, context)?.map(move |batch| {
            let batch = batch?;
            let n = batch.num_rows() as u64;
            let first = next;
            next += n;
            let keep: BooleanArray = (first..first + n)
                .map(|i| Some(i % shards == shard))
                .collect();
            let ids: UInt64Array = (first..first + n)
                .filter(|i| i % shards == shard)
                .collect::<Vec<u64>>()
                .into();
            let kept = filter_record_batch(&batch, &keep)?;
            append_ids(&schema, &kept, ids)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// Merges the shards' answers of each left row (all in one partition after the hash
/// repartition): drops self pairs under `exclude_self`, orders by distance (nearest first) then
/// right row position, keeps `k` for knn_join and ranks again; drops the row-id columns.
#[derive(Debug)]
pub struct ShardMergeExec {
    input: Arc<dyn ExecutionPlan>,
    spec: Arc<JoinSpec>,
    left_id: usize,
    right_id: usize,
    distance: usize,
    rank: Option<usize>,
    kept: Vec<usize>,
    schema: SchemaRef,
    cache: Arc<PlanProperties>,
}

impl ShardMergeExec {
    pub fn try_new(input: Arc<dyn ExecutionPlan>, spec: Arc<JoinSpec>) -> Result<Self> {
        let in_schema = input.schema();
        let left_id = in_schema.index_of(&format!("{QUERY_PREFIX}{ROW_ID}"))?;
        let right_id = in_schema.index_of(&format!("{NEIGHBOR_PREFIX}{ROW_ID}"))?;
        let distance = in_schema.index_of(super::spec::DISTANCE_COLUMN)?;
        let rank = in_schema.index_of(RANK_COLUMN).ok();
        let kept: Vec<usize> = (0..in_schema.fields().len())
            .filter(|&i| i != left_id && i != right_id)
            .collect();
        let schema = Arc::new(in_schema.project(&kept)?);
        let cache = properties(
            Arc::clone(&schema),
            input.output_partitioning().partition_count(),
        );
        Ok(Self {
            input,
            spec,
            left_id,
            right_id,
            distance,
            rank,
            kept,
            schema,
            cache,
        })
    }

    pub fn spec(&self) -> &JoinSpec {
        &self.spec
    }

    fn merge(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let left = batch.column(self.left_id).as_primitive::<UInt64Type>();
        let right = batch.column(self.right_id).as_primitive::<UInt64Type>();
        let distance = batch
            .column(self.distance)
            .as_any()
            .downcast_ref::<Float64Array>()
            .ok_or_else(|| DataFusionError::Internal("distance is not Float64".into()))?;
        let similarity = self.spec.metric.kind.is_similarity();
        let exclude_self = self.spec.options.exclude_self.by_identity();
        let mut order: Vec<u32> = (0..batch.num_rows() as u32)
            .filter(|&i| !exclude_self || left.value(i as usize) != right.value(i as usize))
            .collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (a as usize, b as usize);
            let (da, db) = (distance.value(a), distance.value(b));
            let by_distance = if similarity {
                db.total_cmp(&da)
            } else {
                da.total_cmp(&db)
            };
            left.value(a)
                .cmp(&left.value(b))
                .then(by_distance)
                .then(right.value(a).cmp(&right.value(b)))
        });
        let mut ranks: Vec<i32> = Vec::with_capacity(order.len());
        if let JoinKind::Knn { k } = self.spec.kind {
            let mut taken = Vec::with_capacity(order.len());
            let mut current = None;
            let mut rank = 0i32;
            for i in order {
                let row = left.value(i as usize);
                if current != Some(row) {
                    current = Some(row);
                    rank = 0;
                }
                if (rank as usize) < k {
                    rank += 1;
                    ranks.push(rank);
                    taken.push(i);
                }
            }
            order = taken;
        }
        let indices = UInt32Array::from(order);
        let columns = self
            .kept
            .iter()
            .map(|&i| -> Result<ArrayRef> {
                if Some(i) == self.rank {
                    Ok(Arc::new(Int32Array::from(std::mem::take(&mut ranks))))
                } else {
                    Ok(take(batch.column(i).as_ref(), &indices, None)?)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(indices.len()));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
    }
}

impl DisplayAs for ShardMergeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "ShardMergeExec: {}, right_shards={}",
            self.spec, self.spec.options.right_shards
        )
    }
}

impl ExecutionPlan for ShardMergeExec {
    one_input_plan!("ShardMergeExec");

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => {
                Ok(Arc::new(Self::try_new(input, Arc::clone(&self.spec))?))
            }
            _ => internal_err!("ShardMergeExec takes one child"),
        }
    }

    fn required_input_distribution(&self) -> Vec<datafusion::physical_plan::Distribution> {
        // Every pair of one left row in one partition (a shuffle on Ballista).
        let column = Column::new(self.input.schema().field(self.left_id).name(), self.left_id);
        vec![datafusion::physical_plan::Distribution::KeyPartitioned(
            vec![Arc::new(column)],
        )]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let in_schema = self.input.schema();
        let this = Self::try_new(Arc::clone(&self.input), Arc::clone(&self.spec))?;
        let stream = futures::stream::once(async move {
            let batches: Vec<RecordBatch> = input.try_collect().await?;
            let all = concat_batches(&in_schema, &batches)?;
            this.merge(all)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}
