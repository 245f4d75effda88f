//! The DataFrame form: `knn_join(left_df, right_df, "cosine", 10, "")`, for programs that embed
//! DataFusion. It builds the same logical node as the SQL functions.

use datafusion::common::Result;
use datafusion::dataframe::DataFrame;

use super::logical::SparseJoinNode;
use super::spec::{JoinKind, JoinSpec};
use super::sql::session_options;

/// For every row of `left`, its `k` nearest rows of `right` under `metric`.
///
/// `options` is the SQL options string (`"p=3, dim=100, device=cpu, exclude_self=true"`, or
/// `""`); the session settings of `left` give the defaults. The result runs in `left`'s session,
/// with the join's physical planner installed.
pub fn knn_join(
    left: DataFrame,
    right: DataFrame,
    metric: &str,
    k: usize,
    options: &str,
) -> Result<DataFrame> {
    join(left, right, metric, JoinKind::Knn { k }, options)
}

/// Every pair of rows of `left` and `right` within `radius` under `metric` (for `dot`: at least
/// `radius`).
pub fn radius_join(
    left: DataFrame,
    right: DataFrame,
    metric: &str,
    radius: f64,
    options: &str,
) -> Result<DataFrame> {
    join(left, right, metric, JoinKind::Radius { radius }, options)
}

fn join(
    left: DataFrame,
    right: DataFrame,
    metric: &str,
    kind: JoinKind,
    options: &str,
) -> Result<DataFrame> {
    let (state, left_plan) = left.into_parts();
    let (_, right_plan) = right.into_parts();
    let options = session_options(state.config_options())?
        .apply(options)
        .map_err(|e| e.context(format!("{}: options", kind.function_name())))?;
    let spec = JoinSpec::new(kind, metric, options)?;
    let node = SparseJoinNode::try_new(spec, left_plan, right_plan)?;
    Ok(DataFrame::new(
        super::with_query_planner(state),
        node.into_plan(),
    ))
}
