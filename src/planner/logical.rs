//! The logical plan node of `knn_join` / `radius_join`: two real inputs (so the optimizer pushes
//! projections into their scans) and the call's spec.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion::common::{plan_err, DFSchema, DFSchemaRef, Result};
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNodeCore};

use super::spec::{JoinSpec, Layout};
use crate::options::ExcludeSelf;

/// The position of `exclude_self=COLUMN`'s column in an input: by exact name, else the one
/// column whose name matches ignoring case.
pub(crate) fn exclusion_column(schema: &Schema, column: &str) -> Option<usize> {
    let fields = schema.fields();
    fields.iter().position(|f| f.name() == column).or_else(|| {
        let mut matches = fields
            .iter()
            .enumerate()
            .filter(|(_, f)| f.name().eq_ignore_ascii_case(column));
        match (matches.next(), matches.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    })
}

/// A key column option (`exclude_self=COLUMN`, `within=COLUMN`) names a column of both inputs
/// that is not their vector column.
fn check_key_column(
    spec: &JoinSpec,
    option: &str,
    column: &str,
    left: &LogicalPlan,
    right: &LogicalPlan,
    layout: &Layout,
) -> Result<()> {
    for (side, plan, vector) in [
        ("left", left, layout.left_vector),
        ("right", right, layout.right_vector),
    ] {
        let schema = plan.schema().as_arrow();
        match exclusion_column(schema, column) {
            Some(i) if i == vector => {
                return plan_err!(
                    "{}: {option}={column}: '{column}' is the {side} input's vector column; \
                     name a key column (e.g. an id)",
                    spec.function_name()
                )
            }
            Some(_) => {}
            None => {
                return plan_err!(
                    "{}: {option}={column}: the {side} input has no column '{column}' \
                     (columns: {})",
                    spec.function_name(),
                    schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        }
    }
    Ok(())
}

/// `knn_join(left, right, metric, k, options)` or `radius_join(...)` in a logical plan.
#[derive(Debug, Clone)]
pub struct SparseJoinNode {
    pub spec: Arc<JoinSpec>,
    pub left: LogicalPlan,
    pub right: LogicalPlan,
    /// Names of the vector columns, so the node finds them again after its inputs are pruned.
    pub left_vector: String,
    pub right_vector: String,
    pub layout: Layout,
    schema: DFSchemaRef,
}

impl SparseJoinNode {
    /// Plans a join of two logical plans; errors name the function and what is wrong.
    pub fn try_new(spec: JoinSpec, left: LogicalPlan, right: LogicalPlan) -> Result<Self> {
        let layout = Layout::new(&spec, left.schema().as_arrow(), right.schema().as_arrow())?;
        match &spec.options.exclude_self {
            // Row identity is known only when both sides are one input: the same table, path or
            // query (checked before the optimizer gives each side its own projection).
            ExcludeSelf::Identity if left != right => {
                return plan_err!(
                    "{}: exclude_self=true skips a row's pair with itself, which needs the same \
                     input on both sides (the same table, path or query); the left and right \
                     inputs differ here, so rows cannot be matched by identity. Use \
                     exclude_self=COLUMN to skip pairs whose COLUMN values are equal (e.g. \
                     exclude_self=id)",
                    spec.function_name()
                );
            }
            ExcludeSelf::Column(column) => {
                check_key_column(&spec, "exclude_self", column, &left, &right, &layout)?
            }
            _ => {}
        }
        if let Some(column) = &spec.options.within {
            check_key_column(&spec, "within", column, &left, &right, &layout)?;
        }
        let left_vector = left.schema().field(layout.left_vector).name().clone();
        let right_vector = right.schema().field(layout.right_vector).name().clone();
        Self::with_layout(
            Arc::new(spec),
            left,
            right,
            left_vector,
            right_vector,
            layout,
        )
    }

    fn with_layout(
        spec: Arc<JoinSpec>,
        left: LogicalPlan,
        right: LogicalPlan,
        left_vector: String,
        right_vector: String,
        layout: Layout,
    ) -> Result<Self> {
        let schema = layout.output_schema(left.schema().as_arrow(), right.schema().as_arrow());
        Ok(Self {
            spec,
            left,
            right,
            left_vector,
            right_vector,
            layout,
            schema: Arc::new(DFSchema::try_from(schema)?),
        })
    }

    /// The node over two inputs whose vector columns are known by name (inputs may have been
    /// pruned by projection pushdown, or come from a serialised plan).
    pub fn from_parts(
        spec: Arc<JoinSpec>,
        left: LogicalPlan,
        right: LogicalPlan,
        left_vector: String,
        right_vector: String,
    ) -> Result<Self> {
        let find = |plan: &LogicalPlan, name: &str| {
            plan.schema()
                .fields()
                .iter()
                .position(|f| f.name() == name)
                .ok_or_else(|| {
                    datafusion::common::DataFusionError::Internal(format!(
                        "{}: vector column '{name}' lost from its input",
                        spec.function_name()
                    ))
                })
        };
        let layout = Layout::with_vectors(
            &spec,
            left.schema().as_arrow(),
            right.schema().as_arrow(),
            find(&left, &left_vector)?,
            find(&right, &right_vector)?,
        );
        Self::with_layout(spec, left, right, left_vector, right_vector, layout)
    }

    /// The node as a plan.
    pub fn into_plan(self) -> LogicalPlan {
        LogicalPlan::Extension(Extension {
            node: Arc::new(self),
        })
    }

    fn name_of_kind(&self) -> &'static str {
        match self.spec.kind {
            super::JoinKind::Knn { .. } => "KnnJoin",
            super::JoinKind::Radius { .. } => "RadiusJoin",
        }
    }
}

impl PartialEq for SparseJoinNode {
    fn eq(&self, other: &Self) -> bool {
        self.spec.key() == other.spec.key()
            && self.left_vector == other.left_vector
            && self.right_vector == other.right_vector
            && self.left == other.left
            && self.right == other.right
    }
}

impl Eq for SparseJoinNode {}

impl Hash for SparseJoinNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spec.key().hash(state);
        self.left_vector.hash(state);
        self.right_vector.hash(state);
        self.left.hash(state);
        self.right.hash(state);
    }
}

impl PartialOrd for SparseJoinNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match (self.spec.key(), &self.left_vector, &self.right_vector).cmp(&(
            other.spec.key(),
            &other.left_vector,
            &other.right_vector,
        )) {
            Ordering::Equal => (&self.left, &self.right).partial_cmp(&(&other.left, &other.right)),
            o => Some(o),
        }
    }
}

impl UserDefinedLogicalNodeCore for SparseJoinNode {
    fn name(&self) -> &str {
        self.name_of_kind()
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.left, &self.right]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "{}: {}, device={}, left_vector={}, right_vector={}",
            self.name_of_kind(),
            self.spec,
            self.spec.options.device,
            self.left_vector,
            self.right_vector
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let right = inputs.pop().expect("two inputs");
        let left = inputs.pop().expect("two inputs");
        Self::from_parts(
            Arc::clone(&self.spec),
            left,
            right,
            self.left_vector.clone(),
            self.right_vector.clone(),
        )
    }

    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        let (left, right) = self.layout.required_inputs(output_columns);
        if self.spec.options.exclude_self == ExcludeSelf::Identity {
            // One input on both sides: both keep the same columns, so the operator can read
            // it once and probe its own rows (see `SparseJoinExec`).
            let mut both: Vec<usize> = left.into_iter().chain(right).collect();
            if let Some(column) = &self.spec.options.within {
                both.extend(exclusion_column(self.left.schema().as_arrow(), column));
            }
            both.sort_unstable();
            both.dedup();
            return Some(vec![both.clone(), both]);
        }
        // Key columns (exclude_self=COLUMN, within=COLUMN) are read even when the output does
        // not show them.
        let keys: Vec<&str> = match &self.spec.options.exclude_self {
            ExcludeSelf::Column(column) => vec![column.as_str()],
            _ => Vec::new(),
        }
        .into_iter()
        .chain(self.spec.options.within.as_deref())
        .collect();
        let with_keys = |mut needed: Vec<usize>, input: &LogicalPlan| {
            for column in &keys {
                needed.extend(exclusion_column(input.schema().as_arrow(), column));
            }
            needed.sort_unstable();
            needed.dedup();
            needed
        };
        let mut right = with_keys(right, &self.right);
        let left = with_keys(left, &self.left);
        // A left side that filters the right side's source (a lookup by key) takes its rows from
        // the kept side where that holds every column it reads: the right side keeps them too.
        if let Some(predicates) =
            super::filtered::left_filters_right_source(&self.left, &self.right)
        {
            let (left_schema, right_schema) = (
                self.left.schema().as_arrow(),
                self.right.schema().as_arrow(),
            );
            let read = predicates
                .iter()
                .flat_map(|p| p.column_refs())
                .map(|c| c.name.clone())
                .chain(left.iter().map(|&i| left_schema.field(i).name().clone()));
            for name in read {
                right.extend(right_schema.fields().iter().position(|f| f.name() == &name));
            }
            right.sort_unstable();
            right.dedup();
        }
        Some(vec![left, right])
    }
}
