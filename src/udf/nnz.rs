//! `sparse_nnz(v)`: the number of nonzero entries (explicit zeros are not counted, as in the
//! metrics, which see only the support).

use std::sync::Arc;

use arrow::array::Int64Array;
use arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{check_arity, coerce_vector, Args};

const NAME: &str = "sparse_nnz";

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseNnzFunc {
    signature: Signature,
}

impl Default for SparseNnzFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SparseNnzFunc {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(NAME, "1 argument (vector)", types, 1, 1)?;
        Ok(vec![coerce_vector(NAME, 0, &types[0])?])
    }

    fn return_type(&self, _types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let a = Args::new(&args.args, args.number_rows)?;
        let batch = a.vector(NAME, 0, |c| c)?;
        let out: Int64Array = (0..batch.len())
            .map(|r| {
                (!batch.is_null(r))
                    .then(|| batch.row(r).1.iter().filter(|&&v| v != 0.0).count() as i64)
            })
            .collect();
        a.output(Arc::new(out))
    }
}
