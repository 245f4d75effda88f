//! The logical plan node of `knn_join` / `radius_join`: two real inputs (so the optimizer pushes
//! projections into their scans) and the call's spec.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::common::{DFSchema, DFSchemaRef, Result};
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNodeCore};

use super::spec::{JoinSpec, Layout};

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
        Some(vec![left, right])
    }
}
