//! Rows of a matrix handed over as CSR buffers (scipy's `indptr` / `indices` / `data` as
//! `bytes`): one copy into Arrow buffers, no pyarrow objects on the way. A one-row lookup pays
//! about a microsecond here against ~180 µs for a pyarrow table through the C stream interface.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Float32Array, Float64Array, GenericListArray, Int32Array, Int64Array,
    OffsetSizeTrait, StructArray,
};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{ArrowNativeType, Field, Fields};
use datafusion::common::{plan_err, Result};
use datafusion_sparse_knn::join::max_chunk_nnz;
use datafusion_sparse_knn::vector::VectorCheck;
use datafusion_sparse_knn::SparseBatch;
use pyo3::prelude::*;

use crate::value_error;

/// Rows of a sparse matrix, as one Arrow column of the crate's vector type (indices Int32 or
/// Int64, values Float32 or Float64), converted and validated when a fit or a probe reads them.
#[pyclass(frozen, module = "datafusion_sparse_knn._internal")]
pub(crate) struct Csr {
    pub(crate) vectors: ArrayRef,
}

/// `bytes` as `len` values of `T` (native byte order, as numpy's `tobytes()` writes them), in an
/// aligned Arrow buffer.
fn typed<T: ArrowNativeType>(bytes: &[u8], what: &str) -> Result<ScalarBuffer<T>> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return plan_err!(
            "{what}: {} bytes is not a whole number of {size}-byte values",
            bytes.len()
        );
    }
    Ok(ScalarBuffer::new(
        Buffer::from_slice_ref(bytes),
        0,
        bytes.len() / size,
    ))
}

fn list<O: OffsetSizeTrait>(offsets: OffsetBuffer<O>, values: ArrayRef) -> Result<ArrayRef> {
    let field = Arc::new(Field::new_list_field(values.data_type().clone(), false));
    Ok(Arc::new(GenericListArray::<O>::try_new(
        field, offsets, values, None,
    )?))
}

fn vectors(
    indptr: &[u8],
    indices: &[u8],
    data: &[u8],
    wide_indices: bool,
    double: bool,
) -> Result<ArrayRef> {
    let indptr: ScalarBuffer<i64> = typed(indptr, "indptr")?;
    let indices: ArrayRef = if wide_indices {
        Arc::new(Int64Array::new(typed(indices, "indices")?, None))
    } else {
        Arc::new(Int32Array::new(typed(indices, "indices")?, None))
    };
    let values: ArrayRef = if double {
        Arc::new(Float64Array::new(typed(data, "data")?, None))
    } else {
        Arc::new(Float32Array::new(typed(data, "data")?, None))
    };
    let nnz = indices.len();
    if values.len() != nnz {
        return plan_err!(
            "a CSR matrix with {nnz} indices but {} values",
            values.len()
        );
    }
    if indptr.is_empty()
        || indptr[0] != 0
        || indptr.windows(2).any(|w| w[0] > w[1])
        || indptr[indptr.len() - 1] as usize != nnz
    {
        return plan_err!(
            "a CSR matrix's indptr must start at 0, never decrease and end at its {nnz} entries"
        );
    }
    let (indices_list, values_list) = if nnz < i32::MAX as usize {
        let offsets = OffsetBuffer::new(indptr.iter().map(|&o| o as i32).collect());
        (
            list(offsets.clone(), indices)?,
            list(offsets, Arc::clone(&values))?,
        )
    } else {
        let offsets = OffsetBuffer::new(indptr);
        (list(offsets.clone(), indices)?, list(offsets, values)?)
    };
    let fields = Fields::from(vec![
        Field::new("indices", indices_list.data_type().clone(), false),
        Field::new("values", values_list.data_type().clone(), false),
    ]);
    Ok(Arc::new(StructArray::try_new(
        fields,
        vec![indices_list, values_list],
        None,
    )?))
}

#[pymethods]
impl Csr {
    /// `indptr` as int64, `indices` as int32 (or int64 with `wide_indices`), `data` as float32
    /// (or float64 with `double`): a canonical CSR matrix's arrays (`tobytes()`).
    #[new]
    #[pyo3(signature = (indptr, indices, data, wide_indices, double))]
    fn new(
        indptr: &[u8],
        indices: &[u8],
        data: &[u8],
        wide_indices: bool,
        double: bool,
    ) -> PyResult<Self> {
        Ok(Self {
            vectors: vectors(indptr, indices, data, wide_indices, double).map_err(value_error)?,
        })
    }

    #[getter]
    fn num_rows(&self) -> usize {
        self.vectors.len()
    }

    fn __repr__(&self) -> String {
        format!("Csr({} rows)", self.vectors.len())
    }
}

impl Csr {
    /// The rows converted and validated (`check` names the column and carries the metric's
    /// requirements), in pieces of at most `max_chunk_nnz()` entries.
    pub(crate) fn pieces(&self, check: &VectorCheck) -> Result<Vec<SparseBatch>> {
        SparseBatch::try_from_array_chunked(self.vectors.as_ref(), check, max_chunk_nnz())
    }
}
