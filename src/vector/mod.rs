//! The sparse vector column: its canonical Arrow type, the accepted input types, and validation.
//!
//! Every accepted input is converted once into a [`SparseBatch`], whose row pointer is the Arrow
//! list offsets of the canonical type, so a batch reaches either backend without reshaping.

mod column;
mod convert;
mod validate;

pub use column::{find_vector_column, Side};
pub use convert::{is_sparse_vector_type, sparse_vector_field, sparse_vector_type};
pub use validate::VectorCheck;

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, ListArray, StructArray};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field};
use datafusion::common::Result;
use rayon::prelude::*;

pub const INDICES: &str = "indices";
pub const VALUES: &str = "values";

/// Stored entries below which a pass over a batch stays on the calling thread: a lookup's or a
/// few lookups' rows, where waking the pool's threads costs more than the pass.
pub(crate) const SMALL_ENTRIES: usize = 1 << 16;

/// A batch of sparse vectors in CSR form, validated.
///
/// Indices are held in an `i32` buffer (the canonical Arrow type's) but mean the `u32` of their
/// bits: Int32 input is never negative, so nothing changes for it, and UInt32 (or Int64) indices
/// up to 2^32 − 1 keep their value. Code that compares indices only for equality and a consistent
/// order (merges, inverted indices, sorting) may use the `i32`; code that needs the number (range
/// checks, positions, text) reads `i as u32`.
///
/// Row `i` covers `offsets[i]..offsets[i + 1]` of `indices` and `values`; `offsets[0]` need not be
/// zero (a sliced Arrow array keeps its buffers). A null row matches nothing; its range is ignored.
#[derive(Debug, Clone)]
pub struct SparseBatch {
    offsets: ScalarBuffer<i32>,
    indices: ScalarBuffer<i32>,
    values: ScalarBuffer<f32>,
    nulls: Option<NullBuffer>,
}

/// The checks of batches converted but not yet validated, one a batch
/// ([`SparseBatch::try_from_array_chunked_unvalidated`]).
#[must_use = "the batches are not checked until the checks run"]
pub(crate) struct PendingChecks(Vec<VectorCheck>);

impl PendingChecks {
    /// Checks `batches` (those the checks were made with, in order): the first error in row
    /// order.
    pub(crate) fn run(&self, batches: &[SparseBatch]) -> Result<()> {
        debug_assert_eq!(self.0.len(), batches.len());
        self.0
            .iter()
            .zip(batches)
            .try_for_each(|(check, batch)| check.validate(batch))
    }

    pub(crate) fn extend(&mut self, other: PendingChecks) {
        self.0.extend(other.0);
    }

    pub(crate) fn none() -> Self {
        Self(Vec::new())
    }
}

impl SparseBatch {
    /// Converts any accepted vector array (see the SPEC) and validates it; `check` names the
    /// column and the first row for error messages, and carries the metric's requirements.
    pub fn try_from_array(array: &dyn Array, check: &VectorCheck) -> Result<Self> {
        let batch = convert::to_sparse_batch(array, check)?;
        check.validate(&batch)?;
        Ok(batch)
    }

    /// [`SparseBatch::try_from_array`] for a column of any size: consecutive row ranges of at
    /// most `max_entries` stored entries each (see `join::max_chunk_nnz`).
    pub fn try_from_array_chunked(
        array: &dyn Array,
        check: &VectorCheck,
        max_entries: usize,
    ) -> Result<Vec<Self>> {
        let (batches, checks) =
            Self::try_from_array_chunked_unvalidated(array, check, max_entries)?;
        checks.run(&batches)?;
        Ok(batches)
    }

    /// [`SparseBatch::try_from_array_chunked`] with the rows' checks handed back to run later:
    /// the batches are safe to read (valid offsets, no negative index) but their values and
    /// index order are not yet checked, so nothing may come of them until the checks pass. A
    /// build that only reads them runs beside the checks (an index file's 11M rows took 0.4 s
    /// of checks before a GPU build).
    pub(crate) fn try_from_array_chunked_unvalidated(
        array: &dyn Array,
        check: &VectorCheck,
        max_entries: usize,
    ) -> Result<(Vec<Self>, PendingChecks)> {
        let batches = convert::to_sparse_batches(array, check, max_entries)?;
        let mut first_row = check.first_row;
        let checks = batches
            .iter()
            .map(|b| {
                let batch_check = check.clone().with_first_row(first_row);
                first_row += b.len() as u64;
                batch_check
            })
            .collect();
        Ok((batches, PendingChecks(checks)))
    }

    /// Builds a batch from parts without validation; the caller guarantees the CSR invariants.
    pub fn from_parts(
        offsets: ScalarBuffer<i32>,
        indices: ScalarBuffer<i32>,
        values: ScalarBuffer<f32>,
        nulls: Option<NullBuffer>,
    ) -> Self {
        debug_assert!(!offsets.is_empty());
        debug_assert_eq!(indices.len(), values.len());
        Self {
            offsets,
            indices,
            values,
            nulls,
        }
    }

    /// Builds a batch from rows of `(index, value)` pairs; `None` is a null row. Panics past
    /// `i32::MAX` entries in all (see [`SparseBatch::try_from_rows`] for data from users).
    pub fn from_rows<'a>(rows: impl IntoIterator<Item = Option<&'a [(i32, f32)]>>) -> Self {
        Self::try_from_rows(rows, "a batch built from rows").unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`SparseBatch::from_rows`], with an error naming `what` when the entries do not fit the
    /// i32 row pointer of the canonical type (the offsets would wrap).
    pub fn try_from_rows<'a>(
        rows: impl IntoIterator<Item = Option<&'a [(i32, f32)]>>,
        what: &str,
    ) -> Result<Self> {
        let mut offsets = vec![0i32];
        let mut indices = Vec::new();
        let mut values = Vec::new();
        let mut valid = Vec::new();
        for row in rows {
            valid.push(row.is_some());
            for &(i, v) in row.unwrap_or(&[]) {
                indices.push(i);
                values.push(v);
            }
            let Ok(end) = i32::try_from(indices.len()) else {
                return datafusion::common::exec_err!(
                    "{what}: more than {} vector entries in one batch; use smaller batches",
                    i32::MAX
                );
            };
            offsets.push(end);
        }
        let nulls = NullBuffer::from(valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        Ok(Self::from_parts(
            offsets.into(),
            indices.into(),
            values.into(),
            nulls,
        ))
    }

    /// Rows `offset..offset + len`, sharing the buffers (offsets keep their absolute values).
    pub fn slice(&self, offset: usize, len: usize) -> Self {
        Self {
            offsets: self.offsets.slice(offset, len + 1),
            indices: self.indices.clone(),
            values: self.values.clone(),
            nulls: self.nulls.as_ref().map(|n| n.slice(offset, len)),
        }
    }

    /// The rows `rows` (in that order, repeats allowed) as a batch of their own, NULLs kept.
    pub fn gather(&self, rows: &[usize]) -> Self {
        let entries: usize = rows.iter().map(|&r| self.row_len(r)).sum();
        let mut offsets = Vec::with_capacity(rows.len() + 1);
        let mut indices = Vec::with_capacity(entries);
        let mut values = Vec::with_capacity(entries);
        offsets.push(0i32);
        for &r in rows {
            let (i, v) = self.row(r);
            indices.extend_from_slice(i);
            values.extend_from_slice(v);
            // No more entries than this batch's own, whose offsets are i32.
            offsets.push(indices.len() as i32);
        }
        let nulls = self
            .nulls
            .as_ref()
            .map(|n| NullBuffer::from(rows.iter().map(|&r| n.is_valid(r)).collect::<Vec<bool>>()));
        Self::from_parts(
            offsets.into(),
            indices.into(),
            values.into(),
            nulls.filter(|n| n.null_count() > 0),
        )
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_null(&self, row: usize) -> bool {
        self.nulls.as_ref().is_some_and(|n| n.is_null(row))
    }

    pub fn nulls(&self) -> Option<&NullBuffer> {
        self.nulls.as_ref()
    }

    /// The CSR row pointer (the list offsets; `offsets()[0]` may be non-zero).
    pub fn offsets(&self) -> &[i32] {
        &self.offsets
    }

    pub fn indices(&self) -> &[i32] {
        &self.indices
    }

    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Row `row` as `(indices, values)`; empty for a null row.
    #[inline]
    pub fn row(&self, row: usize) -> (&[i32], &[f32]) {
        if self.is_null(row) {
            return (&[], &[]);
        }
        let start = self.offsets[row] as usize;
        let end = self.offsets[row + 1] as usize;
        (&self.indices[start..end], &self.values[start..end])
    }

    /// Stored entries of `row` (explicit zeros included).
    pub fn row_len(&self, row: usize) -> usize {
        self.row(row).0.len()
    }

    /// Largest index + 1 over all rows (0 for a batch with no entries).
    /// Stored entries of the longest row (0 for no rows).
    pub fn max_row_len(&self) -> usize {
        (0..self.len()).map(|r| self.row_len(r)).max().unwrap_or(0)
    }

    pub fn max_dim(&self) -> usize {
        let first = self.offsets[0] as usize;
        let last = self.offsets[self.len()] as usize;
        // On every core: a GPU build asks it of each shard before anything else (14M entries at
        // the movielens shape).
        self.indices[first..last]
            .par_iter()
            .with_min_len(1 << 16)
            .map(|&i| i as u32 as usize + 1)
            .max()
            .unwrap_or(0)
    }

    /// Stored entries of all rows.
    pub fn nnz(&self) -> usize {
        (self.offsets[self.len()] - self.offsets[0]) as usize
    }

    /// [`SparseBatch::to_array`] for a function's output: an index above `i32::MAX` (from UInt32
    /// input) does not fit the canonical type's Int32 indices, an error naming `what`.
    pub fn try_to_array(&self, what: &str) -> Result<StructArray> {
        let (first, last) = (self.offsets[0] as usize, self.offsets[self.len()] as usize);
        if let Some(&i) = self.indices[first..last].iter().find(|&&i| i < 0) {
            return datafusion::common::exec_err!(
                "{what}: index {} does not fit the Int32 indices of the output vector type \
                 (indices up to {} are accepted as input and computed with; a vector a function \
                 returns holds indices up to {})",
                i as u32,
                u32::MAX,
                i32::MAX
            );
        }
        Ok(self.to_array())
    }

    /// The canonical Arrow array (`Struct{indices: List<Int32>, values: List<Float32>}`).
    pub fn to_array(&self) -> StructArray {
        let offsets = OffsetBuffer::new(self.offsets.clone());
        let indices = ListArray::new(
            Arc::new(Field::new("item", DataType::Int32, false)),
            offsets.clone(),
            Arc::new(arrow::array::Int32Array::new(self.indices.clone(), None)),
            None,
        );
        let values = ListArray::new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            offsets,
            Arc::new(arrow::array::Float32Array::new(self.values.clone(), None)),
            None,
        );
        let DataType::Struct(fields) = sparse_vector_type() else {
            unreachable!("the canonical type is a struct")
        };
        StructArray::new(
            fields,
            vec![Arc::new(indices) as ArrayRef, Arc::new(values) as ArrayRef],
            self.nulls.clone(),
        )
    }

    /// Concatenates batches into one (the build side of a join). The row pointer is i32, as in
    /// the canonical Arrow type, so more than `i32::MAX` stored entries in all is an error.
    pub fn concat(batches: &[SparseBatch]) -> Result<Self> {
        let total: usize = batches.iter().map(|b| b.nnz()).sum();
        if total > i32::MAX as usize {
            return datafusion::common::exec_err!(
                "the build side holds {total} stored vector entries, more than the {} one \
                 CSR batch can index; use a smaller right input",
                i32::MAX
            );
        }
        // Copied in parallel, each batch into its own range: a GPU build concatenates the
        // whole right side (28M entries took ~0.2 s on one thread).
        let rows: usize = batches.iter().map(|b| b.len()).sum();
        let mut offsets = vec![0i32; rows + 1];
        let mut indices = vec![0i32; total];
        let mut values = vec![0f32; total];
        let mut jobs = Vec::with_capacity(batches.len());
        {
            let (mut offsets_rest, mut indices_rest, mut values_rest) =
                (&mut offsets[1..], &mut indices[..], &mut values[..]);
            let mut base = 0i32;
            for b in batches {
                let nnz = b.nnz();
                let (o, or) = std::mem::take(&mut offsets_rest).split_at_mut(b.len());
                let (i, ir) = std::mem::take(&mut indices_rest).split_at_mut(nnz);
                let (v, vr) = std::mem::take(&mut values_rest).split_at_mut(nnz);
                (offsets_rest, indices_rest, values_rest) = (or, ir, vr);
                jobs.push((b, base, o, i, v));
                base += nnz as i32;
            }
        }
        let copy = |(b, base, o, i, v): (&SparseBatch, i32, &mut [i32], &mut [i32], &mut [f32])| {
            let first = b.offsets[0] as usize;
            let last = b.offsets[b.len()] as usize;
            i.copy_from_slice(&b.indices[first..last]);
            v.copy_from_slice(&b.values[first..last]);
            let shift = base - b.offsets[0];
            for (out, &offset) in o.iter_mut().zip(&b.offsets[1..]) {
                *out = offset + shift;
            }
        };
        // A few lookups' rows launched together (a server's) on the calling thread: handing
        // them to the pool wakes its threads for microseconds of copying.
        if total < SMALL_ENTRIES {
            jobs.into_iter().for_each(copy);
        } else {
            jobs.into_par_iter().for_each(copy);
        }
        let mut valid = Vec::with_capacity(rows);
        for b in batches {
            valid.extend((0..b.len()).map(|r| !b.is_null(r)));
        }
        let nulls = NullBuffer::from(valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        Ok(Self::from_parts(
            offsets.into(),
            indices.into(),
            values.into(),
            nulls,
        ))
    }

    /// Bytes held by the batch's buffers (for memory reservations and metrics).
    pub fn memory_size(&self) -> usize {
        self.offsets.len() * 4 + self.indices.len() * 4 + self.values.len() * 4
    }
}
