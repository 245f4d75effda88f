//! Inputs read whole and in order: [`GatherExec`] puts all partitions of an input, in partition
//! order, into one partition (the row order that ties and `exclude_self` count on), and
//! [`in_file_order`] reads a scan with DataFusion's work stealing off so that order holds.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

/// `name`, `properties`, `children` and `apply_expressions` of an operator with one `input` and
/// a `cache` of its properties (and no expressions).
macro_rules! one_input_plan {
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
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
    };
}

pub(super) fn properties(schema: SchemaRef, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}
pub(super) use one_input_plan;

/// `plan` as one partition: its partitions read in order (which keeps the row order that ties
/// and `exclude_self` count on, unlike `CoalescePartitionsExec`). Also over one partition: the
/// optimizer splits a one-file scan into byte ranges, and below an operator that asks for one
/// partition it then merged them back with a `CoalescePartitionsExec`, in the order they arrived
/// (a tie went to a row of a later row group).
pub fn gather(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    if plan.downcast_ref::<GatherExec>().is_some() {
        plan
    } else {
        Arc::new(GatherExec::new(plan))
    }
}

/// `context` with DataFusion's file-scan work stealing off, for reading an input whose row order
/// counts: with it on (DataFusion's default) an idle partition of a scan takes files or byte
/// ranges from its siblings, so its partitions read one after another no longer give the file's
/// rows in order (a tie went to a row of a later row group).
pub fn in_file_order(context: &Arc<TaskContext>) -> Arc<TaskContext> {
    if !context
        .session_config()
        .options()
        .execution
        .enable_file_stream_work_stealing
    {
        return Arc::clone(context);
    }
    let mut config = context.session_config().clone();
    config
        .options_mut()
        .execution
        .enable_file_stream_work_stealing = false;
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config,
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    ))
}

/// What `plan` gathers (its partitions, in order, make up its rows), or `plan` itself: an
/// operator that reads a whole input reads these partitions side by side and keeps their order.
pub fn gathered(plan: &Arc<dyn ExecutionPlan>) -> &Arc<dyn ExecutionPlan> {
    match plan.downcast_ref::<GatherExec>() {
        Some(gather) => &gather.input,
        None => plan,
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
    one_input_plan!("GatherExec");

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
        let context = in_file_order(&context);
        let stream = futures::stream::iter(0..input.output_partitioning().partition_count())
            .map(move |p| input.execute(p, Arc::clone(&context)))
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            stream,
        )))
    }
}
