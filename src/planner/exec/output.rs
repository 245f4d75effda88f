//! A probe's pairs as output rows: the left input's other columns (`query_*`), the right
//! side's (`neighbor_*`), `distance` and, for k nearest, `rank`, gathered with Arrow's `take`.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Array, Int32Array, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow::compute::take;
use datafusion::common::Result;

use super::probe::ProbeJob;
use crate::index::KeptSide;
use crate::join::PairList;

impl ProbeJob {
    pub(super) fn assemble(
        &self,
        build: &KeptSide,
        batch: &RecordBatch,
        pairs: PairList,
    ) -> Result<RecordBatch> {
        let ranks = self.layout.with_rank.then(|| pairs.ranks());
        let left_rows = UInt32Array::from(pairs.left);
        let right_rows = UInt32Array::from(pairs.right);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for &i in &self.layout.left_others {
            columns.push(take(batch.column(i).as_ref(), &left_rows, None)?);
        }
        for column in build.others.columns() {
            columns.push(take(column.as_ref(), &right_rows, None)?);
        }
        columns.push(Arc::new(Float64Array::from(pairs.distance)));
        if let Some(ranks) = ranks {
            columns.push(Arc::new(Int32Array::from(ranks)));
        }
        let options = RecordBatchOptions::new().with_row_count(Some(left_rows.len()));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
    }
}
