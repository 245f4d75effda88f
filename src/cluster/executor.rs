//! `sparse-knn executor`: a Ballista executor that runs this crate's operators.

use std::sync::Arc;

use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
use datafusion::common::{DataFusionError, Result};

use super::codec::{SparseKnnLogicalCodec, SparseKnnPhysicalCodec};
use super::session::{check_reachable, function_registry, session_config, MAX_MESSAGE_BYTES};

/// Where an executor listens and which scheduler it serves.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    pub scheduler_host: String,
    pub scheduler_port: u16,
    /// Address the executor binds and advertises.
    pub bind_host: String,
    /// Arrow Flight port (other executors and clients fetch results from it).
    pub port: u16,
    /// gRPC port (the scheduler pushes tasks to it).
    pub grpc_port: u16,
    /// Tasks run at a time (0: the machine's cores).
    pub concurrency: usize,
    /// Where shuffle files are written (default: a temporary folder).
    pub work_dir: Option<String>,
}

/// Ballista's executor configuration for `options`, with this crate's sessions, codecs and
/// functions.
pub fn executor_config(options: &ExecutorOptions) -> ExecutorProcessConfig {
    ExecutorProcessConfig {
        bind_host: options.bind_host.clone(),
        external_host: Some(options.bind_host.clone()),
        port: options.port,
        grpc_port: options.grpc_port,
        scheduler_host: options.scheduler_host.clone(),
        scheduler_port: options.scheduler_port,
        scheduler_connect_timeout_seconds: super::session::CONNECT_TIMEOUT.as_secs() as u16,
        vcores: options.concurrency,
        work_dir: options.work_dir.clone(),
        print_thread_info: false,
        grpc_max_decoding_message_size: MAX_MESSAGE_BYTES as u32,
        grpc_max_encoding_message_size: MAX_MESSAGE_BYTES as u32,
        override_config_producer: Some(Arc::new(session_config)),
        override_logical_codec: Some(Arc::new(SparseKnnLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(SparseKnnPhysicalCodec::default())),
        override_function_registry: Some(Arc::new(function_registry())),
        ..Default::default()
    }
}

/// Runs an executor until the process is stopped; fails at once when the scheduler cannot be
/// reached.
pub async fn run(options: ExecutorOptions) -> Result<()> {
    check_reachable("scheduler", &options.scheduler_host, options.scheduler_port).await?;
    if let Some(dir) = &options.work_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            DataFusionError::Execution(format!("executor: cannot create --work-dir {dir}: {e}"))
        })?;
    }
    for (what, port) in [("--port", options.port), ("--grpc-port", options.grpc_port)] {
        std::net::TcpListener::bind((options.bind_host.as_str(), port)).map_err(|e| {
            DataFusionError::Execution(format!(
                "executor: cannot listen on {}:{port} ({what}): {e}",
                options.bind_host
            ))
        })?;
    }
    eprintln!(
        "sparse-knn executor on {}:{} (grpc {}), scheduler {}:{}, {} task(s) at a time",
        options.bind_host,
        options.port,
        options.grpc_port,
        options.scheduler_host,
        options.scheduler_port,
        options.concurrency
    );
    start_executor_process(Arc::new(executor_config(&options)))
        .await
        .map_err(|e| DataFusionError::Execution(format!("executor: {e}")))
}
