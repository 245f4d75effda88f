//! SQL: `FROM knn_join(left, right, 'metric', k [, 'options'])` and `radius_join(...)`, planned by
//! a relation planner so that `left` and `right` become real logical plans (table names, views,
//! CTEs, parenthesised subqueries, or Parquet paths).

use std::sync::Arc;

use datafusion::catalog::{CatalogProviderList, TableProvider};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{
    plan_datafusion_err, plan_err, DFSchema, Result, ScalarValue, TableReference,
};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, ObjectName, ObjectNamePart, TableFactor,
};

use super::logical::SparseJoinNode;
use super::source::{looks_like_path, path_table};
use super::spec::{JoinKind, JoinSpec, OptionsSource};
use crate::options::session_options;

/// Plans the table-factor calls `knn_join(...)` and `radius_join(...)`; every other relation is
/// left to the next planner.
///
/// DataFusion resolves a statement's table names before planning it, and the names inside these
/// calls' arguments are not among them; the planner looks them up itself in `catalogs` (the
/// session's catalog list, given by [`super::register`]).
#[derive(Debug, Default)]
pub struct SparseJoinRelationPlanner {
    catalogs: Option<Arc<dyn CatalogProviderList>>,
}

impl SparseJoinRelationPlanner {
    pub fn new(catalogs: Option<Arc<dyn CatalogProviderList>>) -> Self {
        Self { catalogs }
    }

    /// A scan of a registered table under its full name.
    fn canonical(&self, config: &ConfigOptions, plan: LogicalPlan) -> Result<LogicalPlan> {
        let LogicalPlan::TableScan(scan) = &plan else {
            return Ok(plan);
        };
        if matches!(scan.table_name, TableReference::Full { .. })
            || scan.projection.is_some()
            || !scan.filters.is_empty()
            || scan.fetch.is_some()
            || self.lookup(config, &scan.table_name).is_none()
        {
            return Ok(plan);
        }
        let full = scan.table_name.clone().resolve(
            &config.catalog.default_catalog,
            &config.catalog.default_schema,
        );
        LogicalPlanBuilder::scan(TableReference::from(full), Arc::clone(&scan.source), None)?
            .build()
    }

    /// A table of the session's catalogs, by name.
    fn lookup(
        &self,
        config: &ConfigOptions,
        reference: &TableReference,
    ) -> Option<Arc<dyn TableProvider>> {
        let catalogs = self.catalogs.as_ref()?;
        let resolved = reference.clone().resolve(
            &config.catalog.default_catalog,
            &config.catalog.default_schema,
        );
        let schema = catalogs
            .catalog(&resolved.catalog)?
            .schema(&resolved.schema)?;
        super::source::catalog_table(schema.as_ref(), &resolved.table)
    }
}

/// Which join function a name calls, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Function {
    Knn,
    Radius,
}

impl Function {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "knn_join" => Some(Function::Knn),
            "radius_join" => Some(Function::Radius),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Function::Knn => "knn_join",
            Function::Radius => "radius_join",
        }
    }

    pub(crate) fn usage(self) -> &'static str {
        match self {
            Function::Knn => "knn_join(left, right, 'metric', k [, 'key=value, ...'])",
            Function::Radius => "radius_join(left, right, 'metric', radius [, 'key=value, ...'])",
        }
    }

    /// Checks argument 4 (k or radius).
    pub(crate) fn kind(self, value: Option<ScalarValue>, shown: &str) -> Result<JoinKind> {
        let usage = self.usage();
        match self {
            Function::Knn => {
                let k = match value {
                    Some(v) if v.data_type().is_integer() => v
                        .cast_to(&arrow::datatypes::DataType::Int64)
                        .ok()
                        .and_then(|v| match v {
                            ScalarValue::Int64(Some(k)) => Some(k),
                            _ => None,
                        }),
                    _ => None,
                };
                match k {
                    Some(k) if k >= 1 => Ok(JoinKind::Knn { k: k as usize }),
                    _ => plan_err!("knn_join: argument 4 (k) must be a whole number >= 1, got {shown}; usage: {usage}"),
                }
            }
            Function::Radius => {
                let radius = match value {
                    Some(v) if v.data_type().is_numeric() => v
                        .cast_to(&arrow::datatypes::DataType::Float64)
                        .ok()
                        .and_then(|v| match v {
                            ScalarValue::Float64(Some(r)) => Some(r),
                            _ => None,
                        }),
                    _ => None,
                };
                match radius {
                    Some(radius) => Ok(JoinKind::Radius { radius }),
                    None => plan_err!("radius_join: argument 4 (radius) must be a number, got {shown}; usage: {usage}"),
                }
            }
        }
    }
}

/// Folds a planned argument to a constant (literals, negated literals, casts of literals).
pub(crate) fn constant(expr: &Expr) -> Option<ScalarValue> {
    match expr {
        Expr::Literal(v, _) => Some(v.clone()),
        Expr::Negative(inner) => constant(inner)?.arithmetic_negate().ok(),
        Expr::Cast(c) => constant(&c.expr)?.cast_to(c.field.data_type()).ok(),
        Expr::TryCast(c) => constant(&c.expr)?.cast_to(c.field.data_type()).ok(),
        Expr::Alias(a) => constant(&a.expr),
        _ => None,
    }
}

/// The text of a string constant.
pub(crate) fn string_of(value: &ScalarValue) -> Option<String> {
    match value {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::Utf8View(Some(s))
        | ScalarValue::LargeUtf8(Some(s)) => Some(s.clone()),
        _ => None,
    }
}

impl RelationPlanner for SparseJoinRelationPlanner {
    fn plan_relation(
        &self,
        relation: TableFactor,
        context: &mut dyn RelationPlannerContext,
    ) -> Result<RelationPlanning> {
        let function = match &relation {
            TableFactor::Table {
                name,
                args: Some(_),
                ..
            } if name.0.len() == 1 => match &name.0[0] {
                ObjectNamePart::Identifier(ident) => Function::from_name(&ident.value),
                _ => None,
            },
            _ => None,
        };
        let Some(function) = function else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        let TableFactor::Table {
            alias,
            args: Some(args),
            ..
        } = relation
        else {
            unreachable!("matched above")
        };
        let name = function.name();
        let usage = function.usage();
        let mut exprs = Vec::with_capacity(args.args.len());
        for arg in args.args {
            match arg {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => exprs.push(e),
                other => return plan_err!("{name}: argument '{other}' is not supported: arguments are positional; usage: {usage}"),
            }
        }
        if !(4..=5).contains(&exprs.len()) {
            return plan_err!(
                "{name} takes 4 or 5 arguments, got {}; usage: {usage}",
                exprs.len()
            );
        }
        let mut exprs = exprs.into_iter();
        let (left, right, metric, selection) = (
            exprs.next().expect("4 args"),
            exprs.next().expect("4 args"),
            exprs.next().expect("4 args"),
            exprs.next().expect("4 args"),
        );
        let options_text = exprs.next();

        let metric = match metric {
            // A bare word is taken as the metric's name, as a courtesy.
            SqlExpr::Identifier(ident) => ident.value,
            other => {
                let shown = other.to_string();
                let value = constant(&context.sql_to_expr(other, &DFSchema::empty())?);
                match value.as_ref().and_then(string_of) {
                    Some(s) => s,
                    None => return plan_err!("{name}: argument 3 (metric) must be a string such as 'cosine', got {shown}; usage: {usage}"),
                }
            }
        };
        let shown = selection.to_string();
        let value = constant(&context.sql_to_expr(selection, &DFSchema::empty())?);
        let kind = function.kind(value, &shown)?;
        let mut options = session_options(context.context_provider().options())?;
        let mut source = OptionsSource::from_session(context.context_provider().options());
        if let Some(text) = options_text {
            let shown = text.to_string();
            let value = constant(&context.sql_to_expr(text, &DFSchema::empty())?);
            match value {
                Some(v) if v.is_null() => {}
                Some(v) => match string_of(&v) {
                    Some(s) => {
                        options = options.apply(&s).map_err(|e| e.context(format!("{name}: argument 5 (options)")))?;
                        source = source.with_text(s);
                    }
                    None => return plan_err!("{name}: argument 5 (options) must be a string like 'p=3, dim=100', got {shown}"),
                },
                None => return plan_err!("{name}: argument 5 (options) must be a string like 'p=3, dim=100', got {shown}"),
            }
        }
        let spec = JoinSpec::new(kind, &metric, options)?.with_source(source);
        let left = self.plan_input(context, name, "argument 1 (left)", left)?;
        let right = self.plan_input(context, name, "argument 2 (right)", right)?;
        let both_scans = matches!(
            (&left, &right),
            (LogicalPlan::TableScan(_), LogicalPlan::TableScan(_))
        );
        let (left, right) = if left == right || !both_scans {
            (left, right)
        } else {
            // `pts` and `datafusion.public.pts` are one input (what exclude_self=true needs).
            let config = context.context_provider().options();
            (
                self.canonical(config, left)?,
                self.canonical(config, right)?,
            )
        };
        let node = SparseJoinNode::try_new(spec, left, right)?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            node.into_plan(),
            alias,
        ))))
    }
}

fn table_factor(name: ObjectName) -> TableFactor {
    TableFactor::Table {
        name,
        alias: None,
        args: None,
        with_hints: vec![],
        version: None,
        with_ordinality: false,
        partitions: vec![],
        json_path: None,
        sample: None,
        index_hints: vec![],
    }
}

impl SparseJoinRelationPlanner {
    /// A table for an object-store URL (`'s3://bucket/x.parquet'`), from the session's URL
    /// tables. Unlike [`Self::lookup`], errors (credentials, missing object) are kept: they are
    /// the answer the user needs.
    fn lookup_url(
        &self,
        config: &ConfigOptions,
        url: &str,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        let Some(catalogs) = self.catalogs.as_ref() else {
            return Ok(None);
        };
        let Some(schema) = catalogs
            .catalog(&config.catalog.default_catalog)
            .and_then(|c| c.schema(&config.catalog.default_schema))
        else {
            return Ok(None);
        };
        super::source::block_on_io(url, schema.table(url))
    }

    /// Plans one input: a table name (bare, quoted or qualified), a parenthesised subquery, or a
    /// string that names a table or a Parquet file or folder.
    fn plan_input(
        &self,
        context: &mut dyn RelationPlannerContext,
        function: &str,
        argument: &str,
        expr: SqlExpr,
    ) -> Result<LogicalPlan> {
        let in_context =
            |e: datafusion::common::DataFusionError| e.context(format!("{function}: {argument}"));
        match expr {
            SqlExpr::Identifier(ident) => self
                .plan_name(context, ObjectName::from(vec![ident]))
                .map_err(in_context),
            SqlExpr::CompoundIdentifier(idents) => self
                .plan_name(context, ObjectName::from(idents))
                .map_err(in_context),
            SqlExpr::Subquery(query) => context
                .plan(TableFactor::Derived {
                    lateral: false,
                    subquery: query,
                    alias: None,
                    sample: None,
                })
                .map_err(in_context),
            SqlExpr::Nested(inner) => self.plan_input(context, function, argument, *inner),
            other => {
                let shown = other.to_string();
                let value = context
                    .sql_to_expr(other, &DFSchema::empty())
                    .ok()
                    .as_ref()
                    .and_then(constant);
                let Some(text) = value.as_ref().and_then(string_of) else {
                    return plan_err!(
                        "{function}: {argument} must be a table name, a parenthesised subquery or a Parquet path string, got {shown}"
                    );
                };
                let config = context.context_provider().options();
                if super::source::is_object_store_url(&text) {
                    let Some(table) = self.lookup_url(config, &text).map_err(in_context)? else {
                        return plan_err!(
                            "{function}: {argument}: '{text}' is an object-store URL, which this session cannot read: enable URL tables (SessionContext::enable_url_table) and register an object store for it (`sparse-knn sql` does both for s3://)"
                        );
                    };
                    return LogicalPlanBuilder::scan(
                        TableReference::bare(text.as_str()),
                        provider_as_source(table),
                        None,
                    )?
                    .build();
                }
                let reference = TableReference::from(text.as_str());
                if let Some(table) = self.lookup(config, &reference) {
                    return LogicalPlanBuilder::scan(reference, provider_as_source(table), None)?
                        .build();
                }
                if looks_like_path(&text) {
                    let table = path_table(function, argument, &text, config)?;
                    return LogicalPlanBuilder::scan(
                        TableReference::bare(text.as_str()),
                        provider_as_source(table),
                        None,
                    )?
                    .build();
                }
                Err(plan_datafusion_err!(
                    "{function}: {argument}: '{text}' is neither a registered table nor an existing Parquet file or folder"
                ))
            }
        }
    }

    /// A name: a CTE or a table DataFusion resolved already, else a table of the catalogs.
    fn plan_name(
        &self,
        context: &mut dyn RelationPlannerContext,
        name: ObjectName,
    ) -> Result<LogicalPlan> {
        match context.plan(table_factor(name.clone())) {
            Ok(plan) => Ok(plan),
            Err(e) => {
                let reference = context.object_name_to_table_reference(name)?;
                match self.lookup(context.context_provider().options(), &reference) {
                    Some(table) => {
                        LogicalPlanBuilder::scan(reference, provider_as_source(table), None)?
                            .build()
                    }
                    None => Err(e),
                }
            }
        }
    }
}
