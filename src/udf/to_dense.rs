//! `sparse_to_dense(v, d)`: a sparse vector to a dense `List<Float32>` of length `d`.

use std::sync::Arc;

use arrow::array::{Array, Float32Array, ListArray};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field};
use datafusion::common::{exec_err, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{arg_label, check_arity, coerce_integer, coerce_vector, Args};

const NAME: &str = "sparse_to_dense";

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseToDenseFunc {
    signature: Signature,
}

impl Default for SparseToDenseFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

fn item_field() -> Arc<Field> {
    Arc::new(Field::new("item", DataType::Float32, false))
}

impl ScalarUDFImpl for SparseToDenseFunc {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(NAME, "2 arguments (vector, dimension)", types, 2, 2)?;
        Ok(vec![
            coerce_vector(NAME, 0, &types[0])?,
            coerce_integer(NAME, 1, "dimension", &types[1])?,
        ])
    }

    fn return_type(&self, _types: &[DataType]) -> Result<DataType> {
        Ok(DataType::List(item_field()))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let a = Args::new(&args.args, args.number_rows)?;
        let batch = a.vector(NAME, 0, |c| c)?;
        let dims = a.integers(1)?;
        let mut offsets = Vec::with_capacity(a.rows() + 1);
        offsets.push(0i32);
        let mut values: Vec<f32> = Vec::new();
        let mut valid = Vec::with_capacity(a.rows());
        for row in 0..a.rows() {
            let (vr, dr) = (a.at(0, row), a.at(1, row));
            let is_valid = !batch.is_null(vr) && dims.is_valid(dr);
            valid.push(is_valid);
            if is_valid {
                let d = dims.value(dr);
                // List<Float32> offsets are i32, so one batch holds at most i32::MAX floats.
                if d < 0 || d > i32::MAX as i64 - values.len() as i64 {
                    return if d < 0 {
                        exec_err!(
                            "{} (dimension) must be >= 0, got {d} (row {row})",
                            arg_label(NAME, 1)
                        )
                    } else {
                        exec_err!(
                            "{} (dimension) {d} is too large: a batch of dense vectors holds at most {} values",
                            arg_label(NAME, 1),
                            i32::MAX
                        )
                    };
                }
                let start = values.len();
                values.resize(start + d as usize, 0.0);
                let (idx, val) = batch.row(vr);
                for (&i, &v) in idx.iter().zip(val) {
                    if i as u32 as i64 >= d {
                        return exec_err!(
                            "{}, row {row}: index {} is out of range for dimension {d} (indices are 0-based and must be < {d})",
                            arg_label(NAME, 0),
                            i as u32
                        );
                    }
                    values[start + i as u32 as usize] = v;
                }
            }
            offsets.push(values.len() as i32);
        }
        let nulls = NullBuffer::from(valid);
        let list = ListArray::try_new(
            item_field(),
            OffsetBuffer::new(offsets.into()),
            Arc::new(Float32Array::from(values)),
            (nulls.null_count() > 0).then_some(nulls),
        )?;
        a.output(Arc::new(list))
    }
}
