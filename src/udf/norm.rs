//! `sparse_norm(v [, 'l1'|'l2'])`: the L1 or L2 norm of a vector (L2 when left out), in Float64.

use std::sync::Arc;

use arrow::array::Float64Array;
use arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{check_arity, coerce_string, coerce_vector, Args, NormArg};

const NAME: &str = "sparse_norm";

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseNormFunc {
    signature: Signature,
}

impl Default for SparseNormFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SparseNormFunc {
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
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n_args = args.args.len();
        let a = Args::new(&args.args, args.number_rows)?;
        let batch = a.vector(NAME, 0, |c| c)?;
        let norm = NormArg::from_args(NAME, &a, 1, n_args)?;
        let out: Float64Array = (0..a.rows())
            .map(|row| {
                let vr = a.at(0, row);
                let kind = norm.get(row)?;
                (!batch.is_null(vr)).then(|| kind.of(batch.row(vr).1))
            })
            .collect();
        a.output(Arc::new(out))
    }
}
