//! Python bindings of `datafusion-sparse-knn` (module `datafusion_sparse_knn._internal`).
//!
//! Three ways in, all thin layers over the main crate's public API:
//! - datafusion-python (`ffi.rs`): every scalar function and the `knn_join` / `radius_join`
//!   table functions are exported through datafusion-ffi's PyCapsules
//!   (`__datafusion_scalar_udf__`, `__datafusion_table_function__`), which
//!   `SessionContext.register_udf` / `register_udtf` accept.
//! - One-shot calls without DataFusion in Python (`joins.rs`): `kneighbors`, `radius_neighbors`
//!   and `join_table` run the crate's DataFrame-level `knn_join` / `radius_join` in a session of
//!   their own, on inputs held as [`source::Source`]s (Arrow data or a Parquet path).
//! - A fitted index (`fitted.rs`): `FittedIndex` builds the right side once and probes it with
//!   query rows directly, without a DataFusion plan (the estimator `NearestNeighbors`, the
//!   graphs, `pairwise_distances`: the index's distance matrix written into a numpy array);
//!   query rows from matrices come as CSR buffers (`csr.rs`).
//!
//! The Python package (`python/python/datafusion_sparse_knn/`) turns user inputs into sources or
//! CSR buffers and shapes the results like scikit-learn's. Work runs with the GIL released.

mod csr;
mod ffi;
mod fitted;
mod joins;
mod source;

use std::sync::OnceLock;

use datafusion::common::DataFusionError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

/// One runtime for the module: the joins run on it (with the GIL released), and datafusion-ffi
/// enters it whenever datafusion-python executes one of our plans or polls one of our streams,
/// since the thread-local context of datafusion-python's own copy of tokio is not ours.
pub(crate) fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("sparse-knn")
            .enable_all()
            .build()
            .expect("cannot start the tokio runtime")
    })
}

pub(crate) fn value_error(e: DataFusionError) -> PyErr {
    PyValueError::new_err(e.strip_backtrace())
}

#[pymodule]
fn _internal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The joins' inputs may be datafusion-python's scans, which must be polled where
    // datafusion-python polls the join, not on our runtime's threads (see `ffi::ResolvedAtScan`).
    datafusion_sparse_knn::planner::poll_inputs_in_place();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<source::Source>()?;
    m.add_class::<joins::ArrowStream>()?;
    m.add_class::<ffi::ScalarFunction>()?;
    m.add_class::<ffi::TableFunction>()?;
    m.add_class::<csr::Csr>()?;
    m.add_class::<fitted::FittedIndex>()?;
    m.add_function(wrap_pyfunction!(joins::kneighbors, m)?)?;
    m.add_function(wrap_pyfunction!(joins::radius_neighbors, m)?)?;
    m.add_function(wrap_pyfunction!(joins::join_table, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::scalar_functions, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::table_functions, m)?)?;
    Ok(())
}
