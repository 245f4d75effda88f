//! A left side that picks rows of the right side's own source by their other columns
//! (`knn_join((SELECT * FROM docs WHERE id = 42), docs, ...)`: a lookup by key), taken from the
//! kept side instead of a new scan of the source: the predicate over the kept other columns, the
//! passing rows' columns and vectors as they were read. The operator falls back on its left
//! input where the kept side holds no vectors (see `KeptSide::vectors`).

use std::sync::Arc;

use arrow::array::BooleanBufferBuilder;
use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::SchemaRef;
use datafusion::common::{exec_err, Result};
use datafusion::physical_expr::PhysicalExpr;
use rayon::prelude::*;

use crate::index::{KeptSide, KeptVectors, Zones};
use crate::join::MaskProgram;

/// Where each left column comes from in the kept side, and which rows the left side is.
#[derive(Debug)]
pub struct LeftFromKept {
    /// The left input's predicate over the kept side's other columns.
    pub predicate: Arc<dyn PhysicalExpr>,
    /// Per left column: the kept vectors (None) or that column of the kept others.
    pub columns: Vec<Option<usize>>,
}

/// The left rows `left` picks from a kept side (its other columns and its `vectors`), in the
/// side's row order, a batch per run of rows read together.
pub(super) fn left_rows(
    others: &RecordBatch,
    zones: Option<&Zones>,
    vectors: &KeptVectors,
    left: &LeftFromKept,
    schema: &SchemaRef,
    name: &str,
) -> Result<Vec<RecordBatch>> {
    let passed = rows_passing(&left.predicate, others, zones, name, "left")?;
    let rows: Vec<u32> = passed.set_indices_u32().collect();
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
    Ok(batches)
}

/// Rows of `batch` a slice evaluates at once (see [`rows_passing`]), a zone of the kept side's
/// zone maps: 8K rows make a 64-bit column's intermediate 64 KB, which stays in a core's cache
/// and under the allocator's mmap threshold (at 64K rows each slice's arrays were fresh pages,
/// faulted in and unmapped again: half of a 50% filter's mask time over 1M rows).
const PREDICATE_SLICE: usize = crate::index::ZONE_ROWS;

/// Slices a filter must read, at least, before it runs where the index is kept: a key or a
/// narrow range the zone maps leave to a few slices costs the host less than a launch and the
/// mask's copy back.
const SLICES_WORTH_A_DEVICE: usize = 64;

/// The rows of `side` (its other columns) that pass `predicate`, and whether they were found
/// where its index is kept: a GPU's kernel over the columns it keeps there (see
/// `join::MaskProgram`) when the predicate compiles and the zone maps leave more than a few
/// slices to read, else [`rows_passing`] on the host's cores. Bit for bit the same rows either
/// way; a device that fails is said and the host answers.
pub(super) fn kept_side_passing(
    predicate: &Arc<dyn PhysicalExpr>,
    side: &KeptSide,
    name: &str,
) -> Result<(BooleanBuffer, bool)> {
    let may_pass = side.zones().and_then(|zones| zones.may_pass(predicate));
    let slices = side.others.num_rows().div_ceil(PREDICATE_SLICE);
    let to_read = may_pass
        .as_ref()
        .map_or(slices, |keep| keep.iter().filter(|&&k| k).count());
    if to_read > SLICES_WORTH_A_DEVICE {
        if let Some(program) = MaskProgram::compile(predicate, side.others.schema().as_ref()) {
            match side.index.mask_where_kept(&program, &side.others) {
                Ok(Some(bits)) => return Ok((bits, true)),
                Ok(None) => {}
                // (the host's answer is the same, only slower)
                Err(e) => log::warn!(
                    "{name}: the filter could not run where the index is kept ({e}); \
                     evaluated on the host"
                ),
            }
        }
    }
    let bits = slices_passing(predicate, &side.others, may_pass, name, "right")?;
    Ok((bits, false))
}

/// Whether each row of `batch` (a kept side's other columns) passes `predicate`, a bit a row, a
/// NULL not passing as in a WHERE: evaluated a slice of rows per core (a row's value depends on
/// its row alone), so that a new predicate over 11M kept rows costs milliseconds, not a core's
/// 0.1 s; the slices' bits are joined as they came (whole bytes: a slice is a multiple of 8 rows).
/// A slice the `zones` of `batch` rule out is not evaluated: none of its rows passes.
pub(super) fn rows_passing(
    predicate: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
    zones: Option<&Zones>,
    name: &str,
    side: &str,
) -> Result<BooleanBuffer> {
    let may_pass = zones.and_then(|zones| zones.may_pass(predicate));
    slices_passing(predicate, batch, may_pass, name, side)
}

/// [`rows_passing`] with the zone maps' answer given: a slice `may_pass` rules out is not read.
fn slices_passing(
    predicate: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
    may_pass: Option<Vec<bool>>,
    name: &str,
    side: &str,
) -> Result<BooleanBuffer> {
    let rows = batch.num_rows();
    let slice_len = |i: usize| PREDICATE_SLICE.min(rows - i * PREDICATE_SLICE);
    let evaluate = |i: usize| {
        let len = slice_len(i);
        let values = predicate
            .evaluate(&batch.slice(i * PREDICATE_SLICE, len))?
            .into_array(len)?;
        if values.len() != len {
            return exec_err!(
                "{name}: the {side} side's filter gave {} values for {len} rows",
                values.len()
            );
        }
        passing_bits(values.as_ref(), name, side)
    };
    let slices = rows.div_ceil(PREDICATE_SLICE);
    let read_slice = |i: usize| may_pass.as_ref().is_none_or(|keep| keep[i]);
    let read: Vec<usize> = (0..slices).filter(|&i| read_slice(i)).collect();
    // A few slices (a key, a narrow range) on this thread: handing them to the pool cost more
    // than they do.
    let evaluated: Vec<Result<BooleanBuffer>> = if read.len() <= 4 {
        read.iter().map(|&i| evaluate(i)).collect()
    } else {
        read.par_iter().map(|&i| evaluate(i)).collect()
    };
    let mut bits = BooleanBufferBuilder::new(rows);
    let mut evaluated = evaluated.into_iter();
    for i in 0..slices {
        match read_slice(i).then(|| evaluated.next()).flatten() {
            Some(slice) => bits.append_buffer(&slice?),
            None => bits.append_n(slice_len(i), false),
        }
    }
    Ok(bits.finish())
}

/// A filter's answer as a bitmap of the rows that pass: a NULL does not, as in a WHERE.
pub(super) fn passing_bits(values: &dyn Array, name: &str, side: &str) -> Result<BooleanBuffer> {
    let Some(pass) = values.as_any().downcast_ref::<BooleanArray>() else {
        return exec_err!("{name}: the {side} side's filter did not give a Boolean column");
    };
    Ok(match pass.nulls() {
        Some(valid) => pass.values() & valid.inner(),
        None => pass.values().clone(),
    })
}
