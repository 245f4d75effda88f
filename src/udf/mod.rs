//! The scalar SQL functions of the SPEC, one `ScalarUDFImpl` per file.
//!
//! Every vector argument accepts each input type of the SPEC (converted and validated by
//! [`crate::vector::SparseBatch::try_from_array`], with the argument named in errors) and every
//! vector result has the canonical type [`crate::vector::sparse_vector_type`]. These functions do
//! not depend on the join planner.

mod char_ngrams;
mod common;
mod distance;
mod format;
mod from_dense;
mod nnz;
mod norm;
mod normalize;
mod parse;
mod sparse_vector;
mod to_dense;

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionContext;

pub use char_ngrams::{
    char_ngrams, fnv1a, SparseCharNgramsFunc, DEFAULT_DIM as CHAR_NGRAMS_DEFAULT_DIM,
};
pub use distance::SparseDistanceFunc;
pub use format::SparseFormatFunc;
pub use from_dense::SparseFromDenseFunc;
pub use nnz::SparseNnzFunc;
pub use norm::SparseNormFunc;
pub use normalize::SparseNormalizeFunc;
pub use parse::{parse_sparsevec, SparseParseFunc};
pub use sparse_vector::SparseVectorFunc;
pub use to_dense::SparseToDenseFunc;

/// Every scalar function of the crate.
pub fn functions() -> Vec<Arc<ScalarUDF>> {
    vec![
        Arc::new(ScalarUDF::from(SparseVectorFunc::default())),
        Arc::new(ScalarUDF::from(SparseFromDenseFunc::default())),
        Arc::new(ScalarUDF::from(SparseToDenseFunc::default())),
        Arc::new(ScalarUDF::from(SparseParseFunc::default())),
        Arc::new(ScalarUDF::from(SparseFormatFunc::default())),
        Arc::new(ScalarUDF::from(SparseNnzFunc::default())),
        Arc::new(ScalarUDF::from(SparseNormFunc::default())),
        Arc::new(ScalarUDF::from(SparseNormalizeFunc::default())),
        Arc::new(ScalarUDF::from(SparseCharNgramsFunc::default())),
        Arc::new(ScalarUDF::from(SparseDistanceFunc::default())),
    ]
}

/// Registers every scalar function with `registry` (a `SessionContext` or a `SessionState`).
pub fn register_functions(registry: &mut dyn FunctionRegistry) -> Result<()> {
    for f in functions() {
        registry.register_udf(f)?;
    }
    Ok(())
}

/// Registers every scalar function with a session.
pub fn register(ctx: &SessionContext) -> Result<()> {
    for f in functions() {
        ctx.register_udf(f.as_ref().clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Float64Array};
    use arrow::datatypes::Float64Type;
    use datafusion::prelude::SessionContext;

    /// `register_all` on a session made elsewhere adds the settings too, so SET reaches
    /// sparse_distance's defaults.
    #[tokio::test]
    async fn register_all_on_a_plain_session_enables_the_settings() {
        let ctx = SessionContext::new();
        crate::register_all(&ctx).unwrap();
        ctx.sql("SET sparse_knn.p = 3")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let batches = ctx
            .sql("SELECT sparse_distance([1.0, 0, 0], [0.0, 1.0, 1.0], 'minkowski')")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let got = batches[0].column(0).as_primitive::<Float64Type>().value(0);
        assert!((got - 3f64.powf(1.0 / 3.0)).abs() < 1e-12, "{got}");
        // Registering twice keeps the settings already made.
        crate::register_all(&ctx).unwrap();
        let batches = ctx
            .sql("SELECT sparse_distance([1.0, 0, 0], [0.0, 1.0, 1.0], 'minkowski')")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let again: &Float64Array = batches[0].column(0).as_primitive();
        assert_eq!(again.value(0), got);
    }
}
