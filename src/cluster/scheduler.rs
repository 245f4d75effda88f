//! `sparse-knn scheduler`: a Ballista scheduler whose sessions plan this crate's nodes.

use std::net::SocketAddr;
use std::sync::Arc;

use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::{SchedulerConfig, TaskDistributionPolicy};
use ballista_scheduler::scheduler_process::start_server;
use datafusion::common::{DataFusionError, Result};

use super::codec::{SparseKnnLogicalCodec, SparseKnnPhysicalCodec};
use super::session::{server_state, session_config, MAX_MESSAGE_BYTES};

/// The scheduler's configuration for `bind`: this crate's sessions and codecs, tasks spread
/// round-robin over executors, large messages allowed.
pub fn scheduler_config(bind: SocketAddr) -> SchedulerConfig {
    let mut config = SchedulerConfig {
        bind_host: bind.ip().to_string(),
        external_host: bind.ip().to_string(),
        bind_port: bind.port(),
        task_distribution: TaskDistributionPolicy::RoundRobin,
        grpc_server_max_decoding_message_size: MAX_MESSAGE_BYTES as u32,
        grpc_server_max_encoding_message_size: MAX_MESSAGE_BYTES as u32,
        grpc_client_max_message_size: MAX_MESSAGE_BYTES as u32,
        override_logical_codec: Some(Arc::new(SparseKnnLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(SparseKnnPhysicalCodec::default())),
        ..Default::default()
    };
    config = config
        .with_override_config_producer(Arc::new(session_config))
        .with_override_session_builder(Arc::new(server_state));
    config
}

/// Runs a scheduler on `bind` until the process is stopped.
pub async fn run(bind: SocketAddr) -> Result<()> {
    // Ballista would log a failed bind and carry on; say it here, once, and stop.
    std::net::TcpListener::bind(bind).map_err(|e| {
        DataFusionError::Execution(format!("scheduler: cannot listen on {bind}: {e}"))
    })?;
    let config = scheduler_config(bind);
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| DataFusionError::Execution(format!("scheduler: {e}")))?;
    eprintln!("sparse-knn scheduler listening on {bind} (clients: --cluster df://{bind})");
    start_server(cluster, bind, Arc::new(config))
        .await
        .map_err(|e| DataFusionError::Execution(format!("scheduler: {e}")))
}
