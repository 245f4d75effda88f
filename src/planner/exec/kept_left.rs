//! A left side that picks rows of the right side's own source by their other columns
//! (`knn_join((SELECT * FROM docs WHERE id = 42), docs, ...)`: a lookup by key), taken from the
//! kept side instead of a new scan of the source: the predicate over the kept other columns, the
//! passing rows' columns and vectors as they were read. The operator falls back on its left
//! input where the kept side holds no vectors (see `KeptSide::vectors`).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use datafusion::common::{exec_err, Result};
use datafusion::physical_expr::PhysicalExpr;

use crate::index::KeptSide;

/// Where each left column comes from in the kept side, and which rows the left side is.
#[derive(Debug)]
pub struct LeftFromKept {
    /// The left input's predicate over the kept side's other columns.
    pub predicate: Arc<dyn PhysicalExpr>,
    /// Per left column: the kept vectors (None) or that column of the kept others.
    pub columns: Vec<Option<usize>>,
}

/// The left rows `left` picks from `side`, in the side's row order, a batch per run of rows
/// read together; None where the side keeps no vectors.
pub(super) fn left_rows(
    side: &KeptSide,
    left: &LeftFromKept,
    schema: &SchemaRef,
    name: &str,
) -> Result<Option<Vec<RecordBatch>>> {
    let Some(vectors) = &side.vectors else {
        return Ok(None);
    };
    let others = &side.others;
    let passed = left
        .predicate
        .evaluate(others)?
        .into_array(others.num_rows())?;
    let Some(passed) = passed.as_any().downcast_ref::<BooleanArray>() else {
        return exec_err!("{name}: the left side's filter did not give a Boolean column");
    };
    // A NULL does not pass, as in a WHERE.
    let rows: Vec<u32> = (0..passed.len())
        .filter(|&i| passed.is_valid(i) && passed.value(i))
        .map(|i| i as u32)
        .collect();
    let mut batches = Vec::new();
    for (first, vector_piece) in vectors.take(&rows)? {
        let picked =
            UInt32Array::from_iter_values(rows[first..first + vector_piece.len()].iter().copied());
        let columns = left
            .columns
            .iter()
            .map(|from| match from {
                None => Ok(Arc::clone(&vector_piece)),
                Some(i) => Ok(arrow::compute::take(others.column(*i), &picked, None)?),
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        batches.push(RecordBatch::try_new(Arc::clone(schema), columns)?);
    }
    Ok(Some(batches))
}
