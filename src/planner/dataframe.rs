//! The DataFrame form: `knn_join(left_df, right_df, "cosine", 10, "")`, for programs that embed
//! DataFusion. It builds the same logical node as the SQL functions.

use datafusion::common::Result;
use datafusion::dataframe::DataFrame;

use super::logical::SparseJoinNode;
use super::spec::{JoinKind, JoinSpec, OptionsSource};
use crate::index::SparseIndex;
use crate::options::session_options;

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
    options_text: &str,
) -> Result<DataFrame> {
    let (state, left_plan) = left.into_parts();
    let (_, right_plan) = right.into_parts();
    let options = session_options(state.config_options())?
        .apply(options_text)
        .map_err(|e| e.context(format!("{}: options", kind.function_name())))?;
    let source = OptionsSource::from_session(state.config_options()).with_text(options_text);
    let spec = JoinSpec::new(kind, metric, options)?.with_source(source);
    let node = SparseJoinNode::try_new(spec, left_plan, right_plan)?;
    // A Ballista client's planner sends plans to its cluster (whose sessions know the node):
    // keep it; any other session gets a planner that knows the node.
    let on_cluster = state
        .config()
        .options()
        .entries()
        .iter()
        .any(|e| e.key.starts_with("ballista."));
    let state = if on_cluster {
        state
    } else {
        super::with_query_planner(state)
    };
    Ok(DataFrame::new(state, node.into_plan()))
}

/// The DataFrame joins against a kept index (here, not in `src/index`, which sits below the
/// planner and builds no plans of joins).
impl SparseIndex {
    /// For every row of `left`, its `k` nearest rows of the index under its first metric: the
    /// DataFrame `knn_join` gives (`query_*`, `neighbor_*`, `distance`, `rank`).
    pub fn knn(&self, left: DataFrame, k: usize, options: &str) -> Result<DataFrame> {
        let metric = self.first_metric();
        let (state, plan) = left.into_parts();
        let right = DataFrame::new(state.clone(), self.scan_plan()?);
        let left = DataFrame::new(state, plan);
        knn_join(
            left,
            right,
            metric.name(),
            k,
            &self.join_options(&metric, options),
        )
    }

    /// Every pair of a row of `left` and a row of the index within `radius`.
    pub fn radius(&self, left: DataFrame, radius: f64, options: &str) -> Result<DataFrame> {
        let metric = self.first_metric();
        let (state, plan) = left.into_parts();
        let right = DataFrame::new(state.clone(), self.scan_plan()?);
        let left = DataFrame::new(state, plan);
        radius_join(
            left,
            right,
            metric.name(),
            radius,
            &self.join_options(&metric, options),
        )
    }
}
