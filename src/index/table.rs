//! The index as a table: [`IndexTable`] reads the stored rows, and its scan ([`IndexScanExec`])
//! carries the store, so a join whose right input is this scan (through operators that keep
//! its rows and their order) probes the index the store holds instead of building one.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Result;
use datafusion::datasource::TableType;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};

use super::IndexSource;

/// A [`SparseIndex`](super::SparseIndex) or index file as a table.
#[derive(Debug)]
pub struct IndexTable {
    source: Arc<IndexSource>,
}

impl IndexTable {
    pub(crate) fn new(source: Arc<IndexSource>) -> Self {
        Self { source }
    }

    /// Opens an index file as a table (its header checked now, its rows read when scanned).
    pub fn open(path: &std::path::Path) -> Result<Self> {
        Ok(Self::new(Arc::new(IndexSource::open(path)?)))
    }
}

#[async_trait]
impl TableProvider for IndexTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(self.source.schema())
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(IndexScanExec::new(
            Arc::clone(&self.source),
            projection.cloned(),
        )?))
    }
}

/// Reads an index's stored rows (one partition, in stored order: the order its built index
/// numbers them by).
#[derive(Debug)]
pub struct IndexScanExec {
    source: Arc<IndexSource>,
    projection: Option<Vec<usize>>,
    cache: Arc<PlanProperties>,
}

impl IndexScanExec {
    pub(crate) fn new(source: Arc<IndexSource>, projection: Option<Vec<usize>>) -> Result<Self> {
        let schema = match &projection {
            Some(p) => Arc::new(source.schema().project(p)?),
            None => Arc::clone(source.schema()),
        };
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            source,
            projection,
            cache,
        })
    }

    pub(crate) fn source(&self) -> &Arc<IndexSource> {
        &self.source
    }
}

impl DisplayAs for IndexScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "IndexScanExec: ")?;
        if let Some(path) = self.source.path() {
            write!(f, "file={}, ", path.display())?;
        }
        write!(
            f,
            "rows={}, metrics=[{}]",
            self.source.rows(),
            self.source.served_names().join(", ")
        )?;
        if let Some(p) = &self.projection {
            write!(f, ", projection={p:?}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for IndexScanExec {
    fn name(&self) -> &str {
        "IndexScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        assert_eq!(partition, 0, "IndexScanExec has one partition");
        let batches = self
            .source
            .batches()?
            .iter()
            .map(|b| match &self.projection {
                Some(p) => b.project(p),
                None => Ok(b.clone()),
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let schema = Arc::clone(self.cache.eq_properties.schema());
        Ok(Box::pin(MemoryStream::try_new(batches, schema, None)?))
    }
}

/// The index store a join's right input reads whole and in stored order, if it is one: the scan
/// itself, or the scan under operators that keep its rows and their order (a projection, a
/// gather, batch coalescing). Anything else (a filter, a limit, a repartition) reads other rows
/// or another order, which the store's index does not describe.
pub(crate) fn stored_source(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<IndexSource>> {
    if let Some(scan) = plan.downcast_ref::<IndexScanExec>() {
        return Some(Arc::clone(scan.source()));
    }
    let keeps_rows = matches!(
        plan.name(),
        "ProjectionExec"
            | "CoalesceBatchesExec"
            | "GatherExec"
            | "CoalescePartitionsExec"
            | "CooperativeExec"
    );
    match plan.children().as_slice() {
        [child] if keeps_rows && child.output_partitioning().partition_count() == 1 => {
            stored_source(child)
        }
        _ => None,
    }
}
