//! `sparse-knn scheduler`: a Ballista scheduler whose sessions plan this crate's nodes.
//!
//! An executor that stops sending heartbeats for [`SchedulerOptions::executor_timeout`] is
//! removed, and the tasks it was running (and those whose output it held) run again on the
//! others; a job left with no executor at all fails after the same time. The scheduler says on
//! stderr when an executor registers and when one is removed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballista_scheduler::cluster::{BallistaCluster, ClusterStateEvent};
use ballista_scheduler::config::{SchedulerConfig, TaskDistributionPolicy};
use ballista_scheduler::scheduler_process::{create_scheduler, start_grpc_service};
use ballista_scheduler::scheduler_server::SchedulerServer;
use datafusion::common::{DataFusionError, Result};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use futures::StreamExt;

use super::codec::{SparseKnnLogicalCodec, SparseKnnPhysicalCodec};
use super::session::{server_state, session_config, MAX_MESSAGE_BYTES};

/// How long the scheduler waits for an executor's heartbeat by default before it gives the
/// executor's tasks to the others (Ballista's default is 180 s).
pub const DEFAULT_EXECUTOR_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the scheduler listens and how long it waits for a silent executor.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    pub bind: SocketAddr,
    /// An executor not heard from for this long is removed (whole seconds, at least 2; it should
    /// be several of the executors' heartbeat intervals).
    pub executor_timeout: Duration,
}

impl SchedulerOptions {
    pub fn new(bind: SocketAddr) -> Self {
        Self {
            bind,
            executor_timeout: DEFAULT_EXECUTOR_TIMEOUT,
        }
    }
}

/// The scheduler's configuration for `options`: this crate's sessions and codecs, tasks spread
/// round-robin over executors, large messages allowed, silent executors removed after
/// `options.executor_timeout` (checked every quarter of it, at most every 15 s).
pub fn scheduler_config(options: &SchedulerOptions) -> SchedulerConfig {
    let bind = options.bind;
    let timeout = options.executor_timeout.as_secs().max(2);
    let mut config = SchedulerConfig {
        bind_host: bind.ip().to_string(),
        external_host: bind.ip().to_string(),
        bind_port: bind.port(),
        task_distribution: TaskDistributionPolicy::RoundRobin,
        grpc_server_max_decoding_message_size: MAX_MESSAGE_BYTES as u32,
        grpc_server_max_encoding_message_size: MAX_MESSAGE_BYTES as u32,
        grpc_client_max_message_size: MAX_MESSAGE_BYTES as u32,
        executor_timeout_seconds: timeout,
        expire_dead_executor_interval_seconds: (timeout / 4).clamp(1, 15),
        // A job whose last executor is lost fails after this long without a new one.
        no_executors_grace_period_seconds: timeout,
        override_logical_codec: Some(Arc::new(SparseKnnLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(SparseKnnPhysicalCodec::default())),
        ..Default::default()
    };
    config = config
        .with_override_config_producer(Arc::new(session_config))
        .with_override_session_builder(Arc::new(server_state));
    config
}

/// Prints a line on stderr when an executor registers or is removed.
async fn report_executors(
    scheduler: SchedulerServer<LogicalPlanNode, PhysicalPlanNode>,
    timeout: u64,
) {
    let manager = &scheduler.state.executor_manager;
    let Ok(mut events) = manager.cluster_state_events().await else {
        return;
    };
    // Where each executor listens, for the line that says it is gone.
    let mut known: HashMap<String, String> = HashMap::new();
    while let Some(event) = events.next().await {
        match event {
            ClusterStateEvent::RegisteredExecutor { executor_id } => {
                let at = match manager.get_executor_metadata(&executor_id).await {
                    Ok(m) => format!("{}:{} (grpc {})", m.host, m.port, m.grpc_port),
                    Err(_) => "an unknown address".to_string(),
                };
                eprintln!("sparse-knn scheduler: executor {executor_id} at {at} registered");
                known.insert(executor_id, at);
            }
            ClusterStateEvent::RemovedExecutor { executor_id } => {
                let at = known
                    .remove(&executor_id)
                    .unwrap_or_else(|| "an unknown address".to_string());
                eprintln!(
                    "sparse-knn scheduler: executor {executor_id} at {at} removed (stopped, \
                     or no heartbeat for {timeout} s); its tasks run again on the executors left"
                );
            }
        }
    }
}

/// Runs a scheduler until the process is stopped.
pub async fn run(options: SchedulerOptions) -> Result<()> {
    let bind = options.bind;
    // Ballista would log a failed bind and carry on; say it here, once, and stop.
    std::net::TcpListener::bind(bind).map_err(|e| {
        DataFusionError::Execution(format!("scheduler: cannot listen on {bind}: {e}"))
    })?;
    let config = scheduler_config(&options);
    let failed = |e: ballista_core::error::BallistaError| {
        DataFusionError::Execution(format!("scheduler: {e}"))
    };
    config.validate().map_err(failed)?;
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(failed)?;
    let timeout = config.executor_timeout_seconds;
    let scheduler =
        create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, Arc::new(config))
            .await
            .map_err(failed)?;
    tokio::spawn(report_executors(scheduler.clone(), timeout));
    eprintln!(
        "sparse-knn scheduler listening on {bind} (clients: --cluster df://{bind}); executors \
         not heard from for {timeout} s are removed"
    );
    start_grpc_service(bind, scheduler).await.map_err(failed)
}
