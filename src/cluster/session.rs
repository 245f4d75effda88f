//! Sessions for a Ballista cluster with every sparse-knn function, operator and setting.
//!
//! - [`session_config`]: what every process starts its sessions from: Ballista's settings, the
//!   `sparse_knn.*` settings (so a client's `SET sparse_knn.p = 3` is applied on the scheduler
//!   and the executors too: Ballista sends the session's settings as key/value pairs, and a
//!   process keeps only the keys its own config knows) and this crate's codecs.
//! - [`server_state`]: the scheduler's session: plans `KnnJoin` / `RadiusJoin` nodes.
//! - [`remote_context`]: a client session on `df://HOST:PORT`; [`standalone_context`]: a
//!   scheduler and an executor inside this process (tests, notebooks).

use std::sync::Arc;
use std::time::Duration;

use ballista::prelude::{SessionConfigExt, SessionContextExt};
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::BallistaCodec;
use ballista_core::RuntimeProducer;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::prelude::{SessionConfig, SessionContext};

use super::codec::{SparseKnnLogicalCodec, SparseKnnPhysicalCodec};
use super::watch::{ClusterWatch, OnWait, WatchedPlanner, DEFAULT_CLUSTER_TIMEOUT};
use crate::options::SparseKnnConfig;

/// The largest gRPC message the processes exchange: plans carry in-memory tables (the results
/// of `CREATE TABLE ... AS`), so Ballista's 16 MiB default is raised.
pub const MAX_MESSAGE_BYTES: usize = 512 << 20;

/// How long a client waits for the scheduler to answer before giving up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `config` made fit for the cluster: Ballista's settings, the `sparse_knn.*` settings (kept when
/// already there) and this crate's codecs.
pub fn upgrade_for_cluster(config: SessionConfig) -> SessionConfig {
    let config = if config
        .options()
        .extensions
        .get::<SparseKnnConfig>()
        .is_none()
    {
        config.with_option_extension(SparseKnnConfig::default())
    } else {
        config
    };
    config
        .upgrade_for_ballista()
        .with_information_schema(true)
        .with_ballista_logical_extension_codec(Arc::new(SparseKnnLogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(SparseKnnPhysicalCodec::default()))
        .with_ballista_grpc_client_max_message_size(MAX_MESSAGE_BYTES)
}

/// The config every session of a cluster process starts from (Ballista's "config producer").
pub fn session_config() -> SessionConfig {
    upgrade_for_cluster(SessionConfig::new_with_ballista())
}

/// The config of an executor's sessions: [`session_config`]'s, with one index cache for the
/// whole process, so that the executor's tasks and queries share the right sides they build
/// (a right side is built at most once per executor while it stays in the cache).
pub fn executor_session_config() -> SessionConfig {
    session_config().with_extension(executor_index_cache())
}

/// The index cache an executor process shares among its tasks.
pub fn executor_index_cache() -> Arc<crate::index::IndexCache> {
    static CACHE: std::sync::OnceLock<Arc<crate::index::IndexCache>> = std::sync::OnceLock::new();
    Arc::clone(CACHE.get_or_init(Default::default))
}

/// The scheduler's session for one job's `config` (Ballista's "session builder"): DataFusion's
/// defaults, Ballista's optimizer rules, and everything `register_all` adds.
pub fn server_state(config: SessionConfig) -> Result<SessionState> {
    let state = ballista_core::utils::default_session_builder(upgrade_for_cluster(config))?;
    // The scheduler lists a query's folders when it plans: each job lists them afresh.
    let state = SessionStateBuilder::new_from_existing(state)
        .with_runtime_env(crate::runtime_env_builder().build_arc()?)
        .build();
    let ctx = SessionContext::new_with_state(state);
    crate::register_all(&ctx)?;
    Ok(ctx.state())
}

/// Ballista's function registry (what executors look functions up in) plus this crate's
/// scalar functions. (The codecs also carry them, so this is a second way, not the only one.)
pub fn function_registry() -> BallistaFunctionRegistry {
    let mut registry = BallistaFunctionRegistry::default();
    for f in crate::udf::functions() {
        for alias in f.aliases() {
            registry
                .scalar_functions
                .insert(alias.clone(), Arc::clone(&f));
        }
        registry
            .scalar_functions
            .insert(f.name().to_string(), Arc::clone(&f));
    }
    registry
}

/// `HOST:PORT` of a `df://HOST:PORT` URL (the port defaults to 50050).
pub fn scheduler_address(url: &str) -> Result<(String, u16)> {
    let parsed = url::Url::parse(url).map_err(|e| {
        DataFusionError::Configuration(format!(
            "'{url}' is not a scheduler URL like df://127.0.0.1:50050: {e}"
        ))
    })?;
    if parsed.scheme() != "df" {
        return Err(DataFusionError::Configuration(format!(
            "'{url}' is not a scheduler URL: it must start with df:// (like df://127.0.0.1:50050)"
        )));
    }
    let host = parsed.host_str().ok_or_else(|| {
        DataFusionError::Configuration(format!("'{url}' names no host; like df://127.0.0.1:50050"))
    })?;
    Ok((host.to_string(), parsed.port().unwrap_or(50050)))
}

/// Fails with a one-line error unless something listens at `host:port` within
/// [`CONNECT_TIMEOUT`].
pub async fn check_reachable(what: &str, host: &str, port: u16) -> Result<()> {
    let connect = tokio::net::TcpStream::connect((host, port));
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(DataFusionError::Execution(format!(
            "cannot reach the {what} at {host}:{port}: {e}"
        ))),
        Err(_) => Err(DataFusionError::Execution(format!(
            "cannot reach the {what} at {host}:{port}: no answer in {} s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// A client session on the scheduler at `url` (`df://HOST:PORT`) built from `state` (which
/// should have `register_all`'s functions; tables registered in it must be files the executors
/// can read, or in-memory tables small enough to travel in the plan). Statements are planned
/// here, run on the cluster, and their results stream back.
///
/// A query that finds no live executor waits up to [`DEFAULT_CLUSTER_TIMEOUT`] for one and then
/// fails ([`remote_context_with`] sets the time).
pub async fn remote_context(url: &str, state: SessionState) -> Result<SessionContext> {
    remote_context_with(url, state, DEFAULT_CLUSTER_TIMEOUT, None).await
}

/// [`remote_context`] whose queries wait up to `timeout` for a live executor (before the job is
/// submitted, and while it has not finished) and then fail with an error that says no executor
/// is registered; `on_wait` is told when a query starts waiting (see [`super::watch`]).
pub async fn remote_context_with(
    url: &str,
    state: SessionState,
    timeout: Duration,
    on_wait: Option<OnWait>,
) -> Result<SessionContext> {
    let (host, port) = scheduler_address(url)?;
    check_reachable("scheduler", &host, port).await?;
    let config = upgrade_for_cluster(state.config().clone());
    let session_id = state.session_id().to_string();
    let state = SessionStateBuilder::new_from_existing(state)
        .with_session_id(session_id)
        .with_config(config)
        .build();
    let ctx = SessionContext::remote_with_state(&format!("df://{host}:{port}"), state).await?;
    // Ballista's query planner, with a watch over the plans it sends to the cluster.
    let state = ctx.state();
    let planner = WatchedPlanner {
        inner: Arc::clone(state.query_planner()),
        watch: ClusterWatch {
            host,
            port,
            timeout,
            on_wait,
        },
    };
    let session_id = state.session_id().to_string();
    let state = SessionStateBuilder::new_from_existing(state)
        .with_session_id(session_id)
        .with_query_planner(Arc::new(planner))
        .build();
    let ctx = SessionContext::new_with_state(state);
    // Ballista's client state takes its own list of scalar functions: add ours again.
    crate::udf::register(&ctx)?;
    Ok(ctx)
}

fn codec() -> BallistaCodec {
    BallistaCodec::new(
        Arc::new(SparseKnnLogicalCodec::default()),
        Arc::new(SparseKnnPhysicalCodec::default()),
    )
}

/// A scheduler and one executor running `concurrency` tasks at a time, inside this process,
/// and a client session on them (Ballista's standalone mode, with this crate's sessions, so
/// that `SET sparse_knn.*` reaches them).
pub async fn standalone_context(concurrency: usize) -> Result<SessionContext> {
    let config_producer = Arc::new(session_config);
    let address = ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        Arc::new(server_state),
        config_producer.clone(),
        codec(),
    )
    .await
    .map_err(|e| DataFusionError::Configuration(format!("starting the scheduler: {e}")))?;
    let url = format!("http://localhost:{}", address.port());
    let connect = async {
        loop {
            match SchedulerGrpcClient::connect(url.clone()).await {
                Ok(client) => break client,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    };
    let scheduler = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| {
            DataFusionError::Configuration(format!(
                "the in-process scheduler at {url} does not answer"
            ))
        })?;
    let scheduler = scheduler
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let runtime = crate::runtime_env_builder().build_arc()?;
    let runtime_producer: RuntimeProducer = Arc::new(move |_| Ok(Arc::clone(&runtime)));
    ballista_executor::new_standalone_executor_from_builder(
        scheduler,
        concurrency.max(1),
        Arc::new(executor_session_config),
        runtime_producer,
        codec(),
        function_registry(),
    )
    .await
    .map_err(|e| DataFusionError::Configuration(format!("starting the executor: {e}")))?;
    remote_context(
        &format!("df://localhost:{}", address.port()),
        crate::session_context().state(),
    )
    .await
}
