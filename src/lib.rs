//! Exact nearest-neighbour search and distance joins over sparse vectors for Apache DataFusion.
//!
//! - [`vector`]: the sparse vector column (canonical Arrow type, accepted inputs, validation).
//! - [`metric`]: the 16 metrics as semirings, defined once for both backends.
//! - [`cpu`]: the multi-core backend (inverted index + fused top-k).
//! - [`gpu`]: the CUDA backend (NVRTC-compiled kernels from `kernels/`).
//! - [`udf`]: the scalar SQL functions; [`planner`]: `knn_join` / `radius_join` operators.

pub mod cli;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod confine;
pub mod cpu;
pub mod device;
pub mod generate;
pub mod gpu;
pub mod index;
pub mod join;
pub mod metric;
pub mod options;
pub mod planner;
#[cfg(feature = "serve")]
pub mod serve;
pub mod udf;
pub mod vector;

pub use metric::{Metric, MetricKind};
pub use vector::{sparse_vector_type, SparseBatch};

use std::sync::Arc;

use datafusion::execution::context::SessionContext;
use datafusion::prelude::SessionConfig;

use options::SparseKnnConfig;

/// Registers everything the crate adds to SQL: the `sparse_knn.*` session settings (so that
/// `SET sparse_knn.device = 'cpu'` works), the scalar functions, and the join table functions.
/// Settings already in the session are kept.
pub fn register_all(ctx: &SessionContext) -> datafusion::common::Result<()> {
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        let options = state.config_mut().options_mut();
        if options.extensions.get::<SparseKnnConfig>().is_none() {
            options.extensions.insert(SparseKnnConfig::default());
        }
        // Built right sides kept for later statements (`sparse_knn.index_cache`).
        if state
            .config()
            .get_extension::<index::IndexCache>()
            .is_none()
        {
            state
                .config_mut()
                .set_extension(Arc::new(index::IndexCache::new()));
        }
    }
    udf::register(ctx)?;
    planner::register(ctx)?;
    Ok(())
}

/// The runtime of every session this crate sets up (the CLI, the shell, Python, a cluster's
/// scheduler and executors): DataFusion's defaults, except that a folder's listing is not kept.
/// DataFusion keeps the first listing of a table's folder for the session's life by default
/// (`datafusion.runtime.list_files_cache_limit` 1M, no TTL), so a long-lived session (the shell,
/// an application, a server) never sees a file added to a folder; listing again costs a
/// directory read (or one LIST request) per statement. A session built elsewhere gets the same
/// with `RuntimeEnvBuilder::with_object_list_cache_limit(0)` (docs/sql.md).
pub fn runtime_env_builder() -> datafusion::execution::runtime_env::RuntimeEnvBuilder {
    datafusion::execution::runtime_env::RuntimeEnvBuilder::new().with_object_list_cache_limit(0)
}

/// A session with the `sparse_knn` settings and every function registered, and the
/// information schema on (so `SHOW sparse_knn.device` works).
pub fn session_context() -> SessionContext {
    let config = SessionConfig::new()
        .with_information_schema(true)
        .with_option_extension(SparseKnnConfig::default());
    let runtime = runtime_env_builder()
        .build_arc()
        .expect("a runtime of defaults builds");
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    register_all(&ctx).expect("registering the crate's functions in a new session cannot fail");
    ctx
}
