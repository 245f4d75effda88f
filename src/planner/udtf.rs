//! The same joins as user-defined table functions, for engines that take UDTFs but not relation
//! planners: `knn_join('left_table', 'right_table', 'cosine', 10 [, 'options'])`, where the inputs
//! are table names or Parquet paths given as strings.
//!
//! When [`super::register`] installed the relation planner too, SQL calls reach the relation
//! planner first (it catches the names `knn_join` and `radius_join`), so the UDTF form only
//! answers in sessions set up with [`super::register_udtfs`] alone.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Result, TableReference};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use super::exec::SparseJoinExec;
use super::source::{looks_like_path, path_table};
use super::spec::{JoinSpec, Layout, OptionsSource};
use super::sql::{constant, string_of, Function};
use crate::device::{resolve_device, Device};
use crate::options::session_options;

/// `knn_join` or `radius_join` as a [`TableFunctionImpl`].
#[derive(Debug)]
pub struct SparseJoinFunction {
    function: Function,
}

impl SparseJoinFunction {
    pub fn knn() -> Self {
        Self {
            function: Function::Knn,
        }
    }

    pub fn radius() -> Self {
        Self {
            function: Function::Radius,
        }
    }
}

fn resolve_table(
    session: &dyn Session,
    function: &str,
    argument: &str,
    text: &str,
) -> Result<Arc<dyn TableProvider>> {
    if let Some(state) = session.as_any().downcast_ref::<SessionState>() {
        let reference = TableReference::from(text);
        if let Ok(schema) = state.schema_for_ref(reference.clone()) {
            // A UDTF is called while planning, which is not async.
            if let Some(table) = super::source::catalog_table(schema.as_ref(), reference.table()) {
                return Ok(table);
            }
        }
    } else if let Some(table) = table_from_catalog(session, text) {
        return Ok(table);
    }
    if looks_like_path(text) {
        return path_table(function, argument, text, session.config_options());
    }
    plan_err!("{function}: {argument}: '{text}' is neither a registered table nor an existing Parquet file or folder")
}

/// A session that is no `SessionState` (a foreign one: datafusion-python calling the UDTF through
/// datafusion-ffi) still answers through its catalog list.
fn table_from_catalog(session: &dyn Session, text: &str) -> Option<Arc<dyn TableProvider>> {
    let defaults = &session.config_options().catalog;
    let reference =
        TableReference::from(text).resolve(&defaults.default_catalog, &defaults.default_schema);
    let schema = session
        .catalog_list()
        .catalog(&reference.catalog)?
        .schema(&reference.schema)?;
    super::source::catalog_table(schema.as_ref(), &reference.table)
}

impl TableFunctionImpl for SparseJoinFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let function = self.function;
        let name = function.name();
        let usage = function.usage();
        let exprs: &[Expr] = args.exprs();
        if !(4..=5).contains(&exprs.len()) {
            return plan_err!(
                "{name} takes 4 or 5 arguments, got {}; usage: {usage}",
                exprs.len()
            );
        }
        let text = |i: usize, what: &str| -> Result<String> {
            match constant(&exprs[i]).as_ref().and_then(string_of) {
                Some(s) => Ok(s),
                None => plan_err!(
                    "{name}: argument {} ({what}) must be a string, got {}; usage: {usage}",
                    i + 1,
                    exprs[i]
                ),
            }
        };
        let session = args.session();
        let left_name = text(0, "left table name or path")?;
        let right_name = text(1, "right table name or path")?;
        let metric = text(2, "metric")?;
        let kind = function.kind(constant(&exprs[3]), &exprs[3].to_string())?;
        let mut options = session_options(session.config_options())?;
        let mut source = OptionsSource::from_session(session.config_options());
        if exprs.len() == 5 {
            let given = text(4, "options")?;
            options = options.apply(&given)?;
            source = source.with_text(given);
        }
        let spec = JoinSpec::new(kind, &metric, options)?.with_source(source);
        let left = resolve_table(session, name, "argument 1 (left)", &left_name)?;
        let right = resolve_table(session, name, "argument 2 (right)", &right_name)?;
        let layout = Layout::new(&spec, &left.schema(), &right.schema())?;
        let device = resolve_device(name, spec.options.device)?;
        let schema = Arc::new(layout.output_schema(&left.schema(), &right.schema()));
        Ok(Arc::new(SparseJoinTable {
            spec: Arc::new(spec),
            device,
            left,
            right,
            layout,
            schema,
        }))
    }
}

/// The result of one UDTF call: scans both tables and joins them when scanned.
#[derive(Debug)]
struct SparseJoinTable {
    spec: Arc<JoinSpec>,
    device: Device,
    left: Arc<dyn TableProvider>,
    right: Arc<dyn TableProvider>,
    layout: Layout,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for SparseJoinTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let all: Vec<usize> = (0..self.schema.fields().len()).collect();
        let wanted = projection.unwrap_or(&all);
        let (left_cols, right_cols) = self.layout.required_inputs(wanted);
        let left = self.left.scan(state, Some(&left_cols), &[], None).await?;
        let right = self.right.scan(state, Some(&right_cols), &[], None).await?;
        let left_vector = self
            .left
            .schema()
            .field(self.layout.left_vector)
            .name()
            .clone();
        let right_vector = self
            .right
            .schema()
            .field(self.layout.right_vector)
            .name()
            .clone();
        let join = Arc::new(SparseJoinExec::try_new(
            Arc::clone(&self.spec),
            self.device,
            left,
            right,
            &left_vector,
            &right_vector,
        )?);
        // The pruned join emits the wanted columns in schema order; put them in the asked order.
        let join_schema = join.schema();
        let exprs = wanted
            .iter()
            .map(|&i| {
                let field_name = self.schema.field(i).name();
                let index = join_schema.index_of(field_name)?;
                Ok((
                    Arc::new(Column::new(field_name, index)) as Arc<dyn PhysicalExpr>,
                    field_name.clone(),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(ProjectionExec::try_new(exprs, join)?))
    }
}
