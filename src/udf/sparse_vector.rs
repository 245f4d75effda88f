//! `sparse_vector(indices, values)`: builds a sparse vector from two lists of the same length.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, StructArray};
use arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{check_arity, coerce_number_list, Args};
use crate::vector::{sparse_vector_type, INDICES, VALUES};

const NAME: &str = "sparse_vector";

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseVectorFunc {
    signature: Signature,
}

impl Default for SparseVectorFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SparseVectorFunc {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(NAME, "2 arguments (indices, values)", types, 2, 2)?;
        // Index types are kept (Int64 indices above i32 are rejected by row with their value).
        let indices = match &types[0] {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
                if f.data_type().is_integer() =>
            {
                types[0].clone()
            }
            t => coerce_number_list(NAME, 0, "indices", t, true, DataType::Int32)?,
        };
        let values = coerce_number_list(NAME, 1, "values", &types[1], false, DataType::Float64)?;
        Ok(vec![indices, values])
    }

    fn return_type(&self, _types: &[DataType]) -> Result<DataType> {
        Ok(sparse_vector_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let a = Args::new(&args.args, args.number_rows)?;
        let rows = a.rows();
        let indices = broadcast(a.array(0), a.is_scalar(0), rows)?;
        let values = broadcast(a.array(1), a.is_scalar(1), rows)?;
        // Both lists go through the same conversion and checks as a struct column would, so a
        // length mismatch, a negative or duplicate index or a NaN is reported with its row.
        let nulls = arrow::buffer::NullBuffer::union(indices.nulls(), values.nulls());
        let fields = Fields::from(vec![
            Field::new(INDICES, indices.data_type().clone(), true),
            Field::new(VALUES, values.data_type().clone(), true),
        ]);
        let st = StructArray::try_new(fields, vec![indices, values], nulls)?;
        let batch = crate::vector::SparseBatch::try_from_array(
            &st,
            &crate::vector::VectorCheck::new(format!("{NAME}(indices, values)")),
        )?;
        a.output(Arc::new(batch.try_to_array(NAME)?))
    }
}

/// Repeats a one-row array `rows` times when the other argument is a column.
fn broadcast(array: &ArrayRef, scalar: bool, rows: usize) -> Result<ArrayRef> {
    if !scalar {
        return Ok(Arc::clone(array));
    }
    let indices = arrow::array::UInt32Array::from(vec![0u32; rows]);
    Ok(arrow::compute::take(array.as_ref(), &indices, None)?)
}
