//! `sparse_normalize(v [, 'l1'|'l2'])`: the vector divided by its L1 or L2 norm (L2 when left
//! out). The zero vector has no direction and stays the zero vector.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{check_arity, coerce_string, coerce_vector, Args, NormArg};
use crate::vector::{sparse_vector_type, SparseBatch};

const NAME: &str = "sparse_normalize";

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseNormalizeFunc {
    signature: Signature,
}

impl Default for SparseNormalizeFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SparseNormalizeFunc {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(
            NAME,
            "1 or 2 arguments (vector [, 'l1' | 'l2'])",
            types,
            1,
            2,
        )?;
        let mut out = vec![coerce_vector(NAME, 0, &types[0])?];
        if types.len() == 2 {
            out.push(coerce_string(NAME, 1, "norm", &types[1])?);
        }
        Ok(out)
    }

    fn return_type(&self, _types: &[DataType]) -> Result<DataType> {
        Ok(sparse_vector_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n_args = args.args.len();
        let a = Args::new(&args.args, args.number_rows)?;
        let batch = a.vector(NAME, 0, |c| c)?;
        let norm = NormArg::from_args(NAME, &a, 1, n_args)?;
        let mut rows: Vec<Option<Vec<(i32, f32)>>> = Vec::with_capacity(a.rows());
        for row in 0..a.rows() {
            let vr = a.at(0, row);
            let kind = norm.get(row);
            rows.push(match kind {
                Some(kind) if !batch.is_null(vr) => {
                    let (idx, val) = batch.row(vr);
                    let n = kind.of(val);
                    // Every value of a zero-norm vector is 0 already, so it stays as it is.
                    let scale = |v: f32| if n > 0.0 { (v as f64 / n) as f32 } else { v };
                    Some(idx.iter().zip(val).map(|(&i, &v)| (i, scale(v))).collect())
                }
                _ => None,
            });
        }
        let out = SparseBatch::try_from_rows(rows.iter().map(|r| r.as_deref()), NAME)?;
        a.output(Arc::new(out.try_to_array(NAME)?))
    }
}
