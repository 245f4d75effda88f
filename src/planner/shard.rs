//! `right_shards=N`: the right side split into N shards (right row `i` goes to shard `i mod N`),
//! each joined with the whole left side as its own operator (its own tasks on a cluster), and
//! the per-shard answers merged per left row.
//!
//! ```text
//! ShardMergeExec                      per left row: drop self pairs, order by (distance, right
//!   RepartitionExec(hash(left row))     row), keep k, rank again; a shuffle on Ballista
//!     UnionExec
//!       KnnJoinExec(RowIdExec(left), RightShardExec(right, 0, N))
//!       ...
//!       KnnJoinExec(RowIdExec(left), RightShardExec(right, N-1, N))
//! ```
//!
//! Row ids travel as a hidden column [`ROW_ID`] on both inputs (copied to the join's output as
//! `query___sknn_row` / `neighbor___sknn_row`): the right side's is the global row position, so
//! the merge breaks ties by the right side's row order exactly as one build does. With
//! `exclude_self`, the left side is numbered globally too (one partition, as the unsharded
//! operator does), each shard joins without the exclusion and with k + 1, and the merge drops
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
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use super::exec::SparseJoinExec;
use super::spec::{Device, JoinKind, JoinSpec, NEIGHBOR_PREFIX, QUERY_PREFIX, RANK_COLUMN};

/// The hidden row-id column added to both inputs of a sharded join.
pub const ROW_ID: &str = "__sknn_row";

/// Bits of a left row id that count rows within a partition (the rest is the partition).
const ROW_BITS: u32 = 40;

fn properties(schema: SchemaRef, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

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

/// `plan` as one partition: its partitions read one after the other, in order (which keeps the
/// row order that ties and `exclude_self` count on, unlike `CoalescePartitionsExec`).
pub fn gather(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    if plan.output_partitioning().partition_count() == 1 {
        plan
    } else {
        Arc::new(GatherExec::new(plan))
    }
}

/// All partitions of its input, in order, as one partition. An operator that reads a whole
/// input puts it below itself and asks for `SinglePartition` there, which this satisfies with
/// no `CoalescePartitionsExec` added; and Apache Ballista then gives every task the whole input
/// instead of the task's share of its partitions.
#[derive(Debug)]
pub struct GatherExec {
    input: Arc<dyn ExecutionPlan>,
    cache: Arc<PlanProperties>,
}

impl GatherExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let cache = properties(input.schema(), 1);
        Self { input, cache }
    }
}

impl DisplayAs for GatherExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "GatherExec: {} partitions in order",
            self.input.output_partitioning().partition_count()
        )
    }
}

impl ExecutionPlan for GatherExec {
    fn name(&self) -> &str {
        "GatherExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
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
        match children.pop() {
            Some(input) if children.is_empty() => Ok(Arc::new(Self::new(input))),
            _ => internal_err!("GatherExec takes one child"),
        }
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
            return internal_err!("GatherExec has one partition, asked for {partition}");
        }
        let input = Arc::clone(&self.input);
        let stream = futures::stream::iter(0..input.output_partitioning().partition_count())
            .map(move |p| input.execute(p, Arc::clone(&context)))
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            stream,
        )))
    }
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
    let shards = spec.options.right_shards;
    let exclude_self = spec.options.exclude_self;
    // Each shard's join: no exclusion (done by the merge on global positions), one more
    // neighbour when the merge may drop a self pair, one shard.
    let kind = match spec.kind {
        JoinKind::Knn { k } => JoinKind::Knn {
            k: k + usize::from(exclude_self),
        },
        radius => radius,
    };
    let source = spec
        .source
        .clone()
        .with_text("exclude_self=false, right_shards=1");
    let shard_spec = Arc::new(JoinSpec::parse(kind, spec.metric.name(), source)?);
    let left: Arc<dyn ExecutionPlan> = Arc::new(RowIdExec::new(left, exclude_self));
    let joins = (0..shards)
        .map(|shard| {
            let right: Arc<dyn ExecutionPlan> =
                Arc::new(RightShardExec::new(Arc::clone(&right), shard, shards));
            let join = SparseJoinExec::try_new(
                Arc::clone(&shard_spec),
                device,
                Arc::clone(&left),
                right,
                left_vector,
                right_vector,
            )?;
            Ok(Arc::new(join) as Arc<dyn ExecutionPlan>)
        })
        .collect::<Result<Vec<_>>>()?;
    let partitions = left.output_partitioning().partition_count().max(1);
    let union = UnionExec::try_new(joins)?;
    let key = format!("{QUERY_PREFIX}{ROW_ID}");
    let index = union.schema().index_of(&key)?;
    let hashed = Arc::new(RepartitionExec::try_new(
        union,
        Partitioning::Hash(
            vec![Arc::new(Column::new(&key, index)) as Arc<dyn PhysicalExpr>],
            partitions,
        ),
    )?);
    Ok(Arc::new(ShardMergeExec::try_new(hashed, spec)?))
}

/// Appends [`ROW_ID`] to the left input: `(partition << 40) | row`, or with `single` the global
/// row position over all partitions in order (one output partition).
#[derive(Debug)]
pub struct RowIdExec {
    input: Arc<dyn ExecutionPlan>,
    single: bool,
    schema: SchemaRef,
    cache: Arc<PlanProperties>,
}

impl RowIdExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, single: bool) -> Self {
        let input = if single { gather(input) } else { input };
        let schema = with_row_id(&input.schema());
        let partitions = if single {
            1
        } else {
            input.output_partitioning().partition_count()
        };
        let cache = properties(Arc::clone(&schema), partitions);
        Self {
            input,
            single,
            schema,
            cache,
        }
    }

    pub fn single(&self) -> bool {
        self.single
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

impl DisplayAs for RowIdExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "RowIdExec: single={}", self.single)
    }
}

impl ExecutionPlan for RowIdExec {
    fn name(&self) -> &str {
        "RowIdExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
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
        match children.pop() {
            Some(input) if children.is_empty() => Ok(Arc::new(Self::new(input, self.single))),
            _ => internal_err!("RowIdExec takes one child"),
        }
    }

    fn required_input_distribution(&self) -> Vec<datafusion::physical_plan::Distribution> {
        whole_input_if(self.single)
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
        let parts: Vec<usize> = if self.single {
            (0..self.input.output_partitioning().partition_count()).collect()
        } else {
            vec![partition]
        };
        let base = if self.single {
            0
        } else {
            (partition as u64) << ROW_BITS
        };
        let input = Arc::clone(&self.input);
        let schema = Arc::clone(&self.schema);
        let mut next = base;
        let stream = futures::stream::iter(parts)
            .map(move |p| input.execute(p, Arc::clone(&context)))
            .try_flatten()
            .map(move |batch| {
                let batch = batch?;
                let n = batch.num_rows() as u64;
                let ids = UInt64Array::from_iter_values(next..next + n);
                next += n;
                append_ids(&schema, &batch, ids)
            });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// One shard of the right input: the rows whose global position `i` (over all partitions, in
/// order) has `i mod shards == shard`, with [`ROW_ID`] = `i`. One output partition.
#[derive(Debug)]
pub struct RightShardExec {
    input: Arc<dyn ExecutionPlan>,
    shard: usize,
    shards: usize,
    schema: SchemaRef,
    cache: Arc<PlanProperties>,
}

impl RightShardExec {
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

impl DisplayAs for RightShardExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "RightShardExec: shard={} of {}", self.shard, self.shards)
    }
}

impl ExecutionPlan for RightShardExec {
    fn name(&self) -> &str {
        "RightShardExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
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
        match children.pop() {
            Some(input) if children.is_empty() => {
                Ok(Arc::new(Self::new(input, self.shard, self.shards)))
            }
            _ => internal_err!("RightShardExec takes one child"),
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
            return internal_err!("RightShardExec has one partition, asked for {partition}");
        }
        let parts = 0..self.input.output_partitioning().partition_count();
        let input = Arc::clone(&self.input);
        let schema = Arc::clone(&self.schema);
        let (shard, shards) = (self.shard as u64, self.shards as u64);
        let mut next = 0u64;
        let stream = futures::stream::iter(parts)
            .map(move |p| input.execute(p, Arc::clone(&context)))
            .try_flatten()
            .map(move |batch| {
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
        let exclude_self = self.spec.options.exclude_self;
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
    fn name(&self) -> &str {
        "ShardMergeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
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
