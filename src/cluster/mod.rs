//! Distributed `knn_join` / `radius_join` on Apache Ballista 55: no cluster code of our own,
//! Ballista schedules, shuffles and retries; this module gives it what it needs to run this
//! crate's plans.
//!
//! - [`codec`]: logical and physical extension codecs for the join node, its operators, the
//!   shard operators of `right_shards`, the scalar functions and in-memory tables.
//! - [`session`]: the session config (the `sparse_knn.*` settings and the codecs) and session
//!   states for clients, the scheduler and executors; [`session::remote_context`] and
//!   [`session::standalone_context`] for embedders.
//! - [`scheduler`] / [`executor`]: the `sparse-knn scheduler` and `sparse-knn executor`
//!   processes (executors wait for their scheduler and register again after it restarts; the
//!   scheduler removes silent executors after a bounded time and runs their tasks elsewhere).
//! - [`watch`]: a client's query fails, after a bounded time, when no executor is alive.

pub mod codec;
pub mod executor;
pub mod scheduler;
pub mod session;
pub mod watch;

pub use codec::{SparseKnnLogicalCodec, SparseKnnPhysicalCodec};
pub use session::{
    executor_index_cache, executor_session_config, function_registry, remote_context,
    remote_context_with, server_state, session_config, standalone_context, upgrade_for_cluster,
};
pub use watch::DEFAULT_CLUSTER_TIMEOUT;
