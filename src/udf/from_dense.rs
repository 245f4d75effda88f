//! `sparse_from_dense(list)`: a dense list of numbers to a sparse vector (zeros dropped).

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::{plan_err, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{arg_label, check_arity, coerce_vector, Args};
use crate::vector::sparse_vector_type;

const NAME: &str = "sparse_from_dense";

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseFromDenseFunc {
    signature: Signature,
}

impl Default for SparseFromDenseFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SparseFromDenseFunc {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(NAME, "1 argument (a dense list of numbers)", types, 1, 1)?;
        match &types[0] {
            DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(_, _)
            | DataType::Null => Ok(vec![coerce_vector(NAME, 0, &types[0])?]),
            t => plan_err!(
                "{} must be a dense list of numbers, got {t}",
                arg_label(NAME, 0)
            ),
        }
    }

    fn return_type(&self, _types: &[DataType]) -> Result<DataType> {
        Ok(sparse_vector_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let a = Args::new(&args.args, args.number_rows)?;
        let batch = a.vector(NAME, 0, |c| c)?;
        a.output(Arc::new(batch.try_to_array(NAME)?))
    }
}
