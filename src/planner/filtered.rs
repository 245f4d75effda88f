//! A filtered right side over a kept index: `knn_join(q, (SELECT * FROM docs WHERE lang = 'en'),
//! ...)` probes the index of `docs` itself, built once and kept (session cache, index file),
//! and the predicate becomes a row mask, evaluated for the statement over the columns it reads.
//! A new predicate then costs a scan of those columns, not a read and build of the vectors.
//!
//! Applies where the right input is, below column-only projections and aliases, filters over one
//! table scan (a table, a file, a folder, an index file) whose predicates do not read the vector
//! column; anything else (a join, an aggregate, a LIMIT, a computed column, a predicate on the
//! vectors, `exclude_self=true`, `right_shards`) is planned as before: the filtered rows built.
//!
//! The left side of a lookup by key filters the same source (`knn_join((SELECT * FROM docs WHERE
//! id = 42), docs, ...)`): where its predicate reads only columns the kept side holds, its rows
//! are taken from the kept side ([`left_from_kept`]), not from a new scan of the source.

use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, Result};
use datafusion::datasource::source_as_provider;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{Expr, LogicalPlan, TableScan};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use super::exec::LeftFromKept;
use super::logical::SparseJoinNode;

/// The mask plan's one column.
const PASS_COLUMN: &str = "__sparse_knn_pass";

/// The unfiltered right input (the right side's own columns, so its identity is the
/// unfiltered source's) and the plan of its rows' masks (one Boolean column, a row each).
pub(super) struct FilteredRight {
    pub right: Arc<dyn ExecutionPlan>,
    pub mask: Arc<dyn ExecutionPlan>,
    /// The predicate over the right side's other columns (those the kept side holds), where it
    /// reads only those: evaluated over the kept columns, it needs no scan at all.
    pub over_kept: Option<Arc<dyn PhysicalExpr>>,
}

/// The right input of `node` as an unfiltered source and a mask, where it is a filter over one
/// table scan (see the module docs); None: plan it as it is.
pub(super) async fn filtered_right(
    node: &SparseJoinNode,
    session: &dyn Session,
    planned_right: &Arc<dyn ExecutionPlan>,
) -> Result<Option<FilteredRight>> {
    let options = &node.spec.options;
    if options.exclude_self.by_identity() || options.right_shards > 1 {
        return Ok(None);
    }
    let Some(state) = session.as_any().downcast_ref::<SessionState>() else {
        return Ok(None);
    };
    let Some((scan, mut predicates)) = filters_over_scan(&node.right) else {
        return Ok(None);
    };
    predicates.extend(scan.filters.iter().cloned());
    if predicates.is_empty() || scan.fetch.is_some() {
        return Ok(None);
    }
    let table = scan.source.schema();
    // The predicates' columns, as positions in the table; none may be the vectors (their mask
    // would need the vectors read, which is the build this avoids).
    let mut read = Vec::new();
    for predicate in &predicates {
        for column in predicate.column_refs() {
            if column.name == node.right_vector {
                return Ok(None);
            }
            match table.index_of(&column.name) {
                Ok(i) => read.push(i),
                Err(_) => return Ok(None),
            }
        }
    }
    read.sort_unstable();
    read.dedup();
    // The right side's own columns, in its order, from the table itself.
    let wanted = planned_right.schema();
    let mut columns = Vec::with_capacity(wanted.fields().len());
    for field in wanted.fields() {
        match table.index_of(field.name()) {
            Ok(i) => columns.push(i),
            Err(_) => return Ok(None),
        }
    }
    // Both scans made as DataFusion's planner makes a table scan's, not each through the whole
    // physical optimizer: the plan they end up in is optimized once, as a whole (the two nested
    // passes were 0.3 ms of a filtered lookup's 2.1 ms EXPLAIN on 2 cores).
    let provider = source_as_provider(&scan.source)?;
    let right = provider.scan(state, Some(&columns), &[], None).await?;
    let same_columns = right.schema().fields().len() == wanted.fields().len()
        && right
            .schema()
            .fields()
            .iter()
            .zip(wanted.fields())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
    if !same_columns {
        return Ok(None);
    }
    let Some(predicate) = conjoined_once(predicates)? else {
        return Ok(None);
    };
    let mask_scan = provider.scan(state, Some(&read), &[], None).await?;
    let pass = state.create_physical_expr(
        predicate.clone(),
        &DFSchema::try_from(mask_scan.schema().as_ref().clone())?,
    )?;
    let mask: Arc<dyn ExecutionPlan> = Arc::new(ProjectionExec::try_new(
        [(pass, PASS_COLUMN.to_string())],
        mask_scan,
    )?);
    let over_kept = over_kept_columns(&predicate, &wanted, &node.right_vector, session);
    log::debug!(
        "{}: the right side's filter is a mask over {}'s kept index",
        node.spec.function_name(),
        scan.table_name
    );
    Ok(Some(FilteredRight {
        right,
        mask,
        over_kept,
    }))
}

/// `predicate` over the right side's columns less its vectors (the kept side's `others`), where
/// it reads only those; None where it reads another or does not plan.
fn over_kept_columns(
    predicate: &Expr,
    right: &Schema,
    vectors: &str,
    session: &dyn Session,
) -> Option<Arc<dyn PhysicalExpr>> {
    let others: Vec<_> = right
        .fields()
        .iter()
        .filter(|f| f.name() != vectors)
        .cloned()
        .collect();
    let reads_only_those = predicate
        .column_refs()
        .iter()
        .all(|c| others.iter().any(|f| f.name() == &c.name));
    if !reads_only_those || others.is_empty() {
        return None;
    }
    let schema = DFSchema::try_from(Schema::new(others)).ok()?;
    session
        .create_physical_expr(predicate.clone(), &schema)
        .ok()
}

/// The left input's predicates where it filters (below column-only projections and aliases)
/// the table that the right input scans, unfiltered or filtered (both are then read as the
/// table's one kept side).
pub(super) fn left_filters_right_source(
    left: &LogicalPlan,
    right: &LogicalPlan,
) -> Option<Vec<Expr>> {
    let (left_scan, mut predicates) = filters_over_scan(left)?;
    let (right_scan, _) = filters_over_scan(right)?;
    predicates.extend(left_scan.filters.iter().cloned());
    let same_table = left_scan.table_name == right_scan.table_name
        && left_scan.source.schema() == right_scan.source.schema();
    let whole = left_scan.fetch.is_none() && right_scan.fetch.is_none();
    (same_table && whole && !predicates.is_empty()).then_some(predicates)
}

/// How the left input's rows come from the kept side of `right` (the join's physical right
/// input, over the whole source), where the left filters the right's source and reads nothing
/// the kept side lacks; None: the left input is read.
pub(super) fn left_from_kept(
    node: &SparseJoinNode,
    session: &dyn Session,
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    right_filtered: bool,
) -> Option<LeftFromKept> {
    let options = &node.spec.options;
    if options.exclude_self.by_identity() || options.right_shards > 1 {
        return None;
    }
    // A right side filtered some other way is built from its filtered rows, which need not hold
    // the left's.
    let (right_scan, right_predicates) = filters_over_scan(&node.right)?;
    if !right_filtered && (!right_predicates.is_empty() || !right_scan.filters.is_empty()) {
        return None;
    }
    let predicates = left_filters_right_source(&node.left, &node.right)?;
    let predicate = conjoined_once(predicates).ok()??;
    let right_schema = right.schema();
    let predicate = over_kept_columns(&predicate, &right_schema, &node.right_vector, session)?;
    let others: Vec<_> = right_schema
        .fields()
        .iter()
        .filter(|f| f.name() != &node.right_vector)
        .collect();
    let mut columns = Vec::new();
    for field in left.schema().fields() {
        if field.name() == &node.left_vector {
            let vectors = right_schema.field_with_name(&node.right_vector).ok()?;
            if node.left_vector != node.right_vector || vectors.data_type() != field.data_type() {
                return None;
            }
            columns.push(None);
        } else {
            let at = others
                .iter()
                .position(|f| f.name() == field.name() && f.data_type() == field.data_type())?;
            columns.push(Some(at));
        }
    }
    log::debug!(
        "{}: the left side's rows are taken from the kept right side",
        node.spec.function_name()
    );
    Some(LeftFromKept { predicate, columns })
}

/// `predicates` as one predicate over unqualified columns (above an alias they name the alias;
/// the scan's columns are unambiguous unqualified), each conjunct once, in the order first seen:
/// DataFusion keeps a filter above the scan it pushed the same predicate into
/// (`TableScan::filters`, inexact), and a mask of both evaluated every row's predicate twice
/// (half of a new filter's mask time). None where there is no predicate.
fn conjoined_once(predicates: Vec<Expr>) -> Result<Option<Expr>> {
    let mut distinct: Vec<Expr> = Vec::new();
    for conjunct in predicates.into_iter().flat_map(split_conjunction_owned) {
        let conjunct = unqualified(conjunct)?;
        if !distinct.contains(&conjunct) {
            distinct.push(conjunct);
        }
    }
    Ok(conjunction(distinct))
}

fn unqualified(expr: Expr) -> Result<Expr> {
    expr.transform(|e| {
        Ok(match e {
            Expr::Column(c) => Transformed::yes(Expr::Column(Column::new_unqualified(c.name))),
            e => Transformed::no(e),
        })
    })
    .map(|t| t.data)
}

/// The table scan below `plan`'s filters, column-only projections and aliases, with the
/// filters' predicates; None where anything else stands between.
fn filters_over_scan(plan: &LogicalPlan) -> Option<(&TableScan, Vec<Expr>)> {
    let mut predicates = Vec::new();
    let mut plan = plan;
    loop {
        match plan {
            LogicalPlan::TableScan(scan) => return Some((scan, predicates)),
            LogicalPlan::Filter(filter) => {
                predicates.push(filter.predicate.clone());
                plan = filter.input.as_ref();
            }
            LogicalPlan::Projection(projection)
                if projection.expr.iter().all(|e| matches!(e, Expr::Column(_))) =>
            {
                plan = projection.input.as_ref();
            }
            LogicalPlan::SubqueryAlias(alias) => plan = alias.input.as_ref(),
            _ => return None,
        }
    }
}
