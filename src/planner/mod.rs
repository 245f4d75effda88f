//! `knn_join` and `radius_join`: SQL table functions planned into physical operators.
//!
//! - SQL: a [`RelationPlanner`](datafusion::logical_expr::planner::RelationPlanner)
//!   ([`SparseJoinRelationPlanner`]) turns `FROM knn_join(left, right, 'metric', k [, 'options'])`
//!   into a logical [`SparseJoinNode`] whose two inputs are the real plans of `left` and `right`
//!   (a table name, a parenthesised subquery, or a Parquet path string), so projections reach
//!   their scans.
//! - Physical: an [`ExtensionPlanner`] ([`SparseJoinPlanner`]) plans the node into a
//!   [`SparseJoinExec`] (shown as `KnnJoinExec` / `RadiusJoinExec`), which builds the right side
//!   once and streams the left side through the CPU or GPU probe.
//! - [`knn_join`] / [`radius_join`]: the same node from two DataFrames.
//! - [`SparseJoinFunction`]: the UDTF form, for engines that only take table functions. When both
//!   are registered under the same names, the relation planner wins for SQL.

mod dataframe;
mod exec;
mod filtered;
mod gather;
mod logical;
mod shard;
mod source;
mod spec;
mod sql;
mod udtf;

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::Result;
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use datafusion::prelude::SessionContext;

pub use dataframe::{knn_join, radius_join};
pub(crate) use exec::{plan_of_files, scan_files};
pub use exec::{poll_inputs_in_place, LeftFromKept, SparseJoinExec};
use filtered::{filtered_right, left_from_kept};
pub use gather::{gather, gathered, in_file_order, GatherExec};
pub use logical::SparseJoinNode;
pub use shard::{plan_sharded, PartitionExec, ShardExec, ShardMergeExec, ShardedJoinExec, ROW_ID};
pub use source::{
    is_object_store_url, looks_like_path, path_table, url_table_failure, url_table_session,
    with_url_tables,
};
pub use spec::{
    JoinKind, JoinSpec, Layout, OptionsSource, DISTANCE_COLUMN, NEIGHBOR_PREFIX, QUERY_PREFIX,
    RANK_COLUMN,
};
pub use sql::SparseJoinRelationPlanner;
// The device and the vector column, which the planner resolves, for embedders that name them
// here.
pub use crate::device::{resolve_device, Device};
pub use crate::vector::{find_vector_column, Side};
pub use udtf::SparseJoinFunction;

/// Registers `knn_join` and `radius_join` on a session: the SQL relation planner, the physical
/// planner of their operators, and the UDTF form under the same names (reached only where the
/// relation planner is not consulted).
///
/// This replaces the session's query planner with DataFusion's default planner plus this
/// crate's extension planner.
pub fn register(ctx: &SessionContext) -> Result<()> {
    ctx.register_relation_planner(Arc::new(SparseJoinRelationPlanner::new(Some(Arc::clone(
        ctx.state().catalog_list(),
    )))))?;
    register_udtfs(ctx);
    let state = ctx.state_ref();
    let mut state = state.write();
    *state = with_query_planner(state.clone());
    Ok(())
}

/// Registers only the UDTF form (`knn_join('left_table', 'right_table', 'cosine', 10)`: inputs
/// are table names or Parquet paths as strings). It needs no planner of its own.
pub fn register_udtfs(ctx: &SessionContext) {
    ctx.register_udtf("knn_join", Arc::new(SparseJoinFunction::knn()));
    ctx.register_udtf("radius_join", Arc::new(SparseJoinFunction::radius()));
}

/// `state` with a query planner that knows this crate's logical nodes.
pub fn with_query_planner(state: SessionState) -> SessionState {
    let session_id = state.session_id().to_string();
    SessionStateBuilder::new_from_existing(state)
        .with_session_id(session_id)
        .with_query_planner(Arc::new(SparseKnnQueryPlanner))
        .build()
}

/// DataFusion's default physical planner plus [`SparseJoinPlanner`].
#[derive(Debug, Default)]
pub struct SparseKnnQueryPlanner;

#[async_trait]
impl QueryPlanner for SparseKnnQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(SparseJoinPlanner)])
            .create_physical_plan(logical_plan, session)
            .await
    }
}

/// Plans [`SparseJoinNode`] into [`SparseJoinExec`], resolving `device=auto`.
#[derive(Debug, Default)]
pub struct SparseJoinPlanner;

#[async_trait]
impl ExtensionPlanner for SparseJoinPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _planning_ctx: &datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<SparseJoinNode>() else {
            return Ok(None);
        };
        let device = resolve_device(node.spec.function_name(), node.spec.options.device)?;
        let (left, right) = (&physical_inputs[0], &physical_inputs[1]);
        if let Some(filtered) = filtered_right(node, session, right).await? {
            let left_from_kept = left_from_kept(node, session, left, &filtered.right, true);
            let join = SparseJoinExec::try_new_masked(
                Arc::clone(&node.spec),
                device,
                Arc::clone(left),
                filtered.right,
                Some(filtered.mask),
                &node.left_vector,
                &node.right_vector,
            )?;
            return Ok(Some(Arc::new(
                join.with_mask_over_kept(filtered.over_kept)
                    .with_left_from_kept(left_from_kept.map(Arc::new)),
            )));
        }
        if let Some(from_kept) = left_from_kept(node, session, left, right, false) {
            let join = SparseJoinExec::try_new(
                Arc::clone(&node.spec),
                device,
                Arc::clone(left),
                Arc::clone(right),
                &node.left_vector,
                &node.right_vector,
            )?;
            return Ok(Some(Arc::new(
                join.with_left_from_kept(Some(Arc::new(from_kept))),
            )));
        }
        let plan = if node.spec.options.right_shards > 1 {
            plan_sharded
        } else {
            |spec, device, left, right, lv: &str, rv: &str| -> Result<Arc<dyn ExecutionPlan>> {
                Ok(Arc::new(SparseJoinExec::try_new(
                    spec, device, left, right, lv, rv,
                )?))
            }
        };
        Ok(Some(plan(
            Arc::clone(&node.spec),
            device,
            Arc::clone(&physical_inputs[0]),
            Arc::clone(&physical_inputs[1]),
            &node.left_vector,
            &node.right_vector,
        )?))
    }
}
