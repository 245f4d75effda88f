//! `sparse-knn scheduler`, `sparse-knn executor`, and the `--cluster df://HOST:PORT` session of
//! `sql` and `knn` (see docs/cluster.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use datafusion::execution::context::SessionContext;

use super::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// Address to listen on (clients use --cluster df://HOST:PORT, executors --scheduler).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050")]
    pub bind: String,
    /// Seconds without a heartbeat after which an executor is removed and its tasks run again
    /// on the others (several of the executors' --heartbeat-interval).
    #[arg(long = "executor-timeout", value_name = "SECS", default_value_t = 30)]
    pub executor_timeout: u64,
}

#[derive(Debug, Args)]
pub struct ExecutorArgs {
    /// The scheduler to register with.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050")]
    pub scheduler: String,
    /// Address this executor listens on and advertises.
    #[arg(long, value_name = "HOST", default_value = "127.0.0.1")]
    pub bind: String,
    /// Arrow Flight port: where results and shuffle data are fetched from.
    #[arg(long, default_value_t = 50051)]
    pub port: u16,
    /// gRPC port: where the scheduler sends tasks.
    #[arg(long = "grpc-port", default_value_t = 50052)]
    pub grpc_port: u16,
    /// Tasks run at a time (default: the machine's cores).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Folder for shuffle files (default: a temporary folder).
    #[arg(long = "work-dir", value_name = "DIR")]
    pub work_dir: Option<String>,
    /// Seconds to wait for the scheduler, at the start and after losing it (0: one try).
    #[arg(long = "scheduler-wait", value_name = "SECS", default_value_t = 120)]
    pub scheduler_wait: u64,
    /// Seconds between heartbeats to the scheduler (well below its --executor-timeout).
    #[arg(long = "heartbeat-interval", value_name = "SECS", default_value_t = 5)]
    pub heartbeat_interval: u64,
}

fn host_port(flag: &str, text: &str) -> CliResult<(String, u16)> {
    let Some((host, port)) = text.rsplit_once(':') else {
        cli_bail!("{flag} '{text}' is not HOST:PORT");
    };
    let port: u16 = port
        .parse()
        .map_err(|_| CliError(format!("{flag} '{text}': '{port}' is not a port number")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        cli_bail!("{flag} '{text}' names no host");
    }
    Ok((host.to_string(), port))
}

pub async fn run_scheduler(args: SchedulerArgs) -> CliResult<()> {
    let (host, port) = host_port("--bind", &args.bind)?;
    let address: SocketAddr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| CliError(format!("--bind '{}': unknown host", args.bind)))?;
    if args.executor_timeout < 2 {
        cli_bail!("--executor-timeout must be at least 2 seconds");
    }
    let options = crate::cluster::scheduler::SchedulerOptions {
        bind: address,
        executor_timeout: Duration::from_secs(args.executor_timeout),
    };
    crate::cluster::scheduler::run(options).await?;
    Ok(())
}

pub async fn run_executor(args: ExecutorArgs) -> CliResult<()> {
    let (scheduler_host, scheduler_port) = host_port("--scheduler", &args.scheduler)?;
    if args.concurrency == Some(0) {
        cli_bail!("--concurrency must be at least 1");
    }
    if args.port == 0 || args.grpc_port == 0 {
        cli_bail!("--port and --grpc-port must be port numbers other than 0");
    }
    if args.heartbeat_interval == 0 {
        cli_bail!("--heartbeat-interval must be at least 1 second");
    }
    let options = crate::cluster::executor::ExecutorOptions {
        scheduler_host,
        scheduler_port,
        bind_host: args.bind,
        port: args.port,
        grpc_port: args.grpc_port,
        concurrency: args.concurrency.unwrap_or(0),
        work_dir: args.work_dir,
        scheduler_wait: Duration::from_secs(args.scheduler_wait),
        heartbeat_interval: Duration::from_secs(args.heartbeat_interval),
    };
    crate::cluster::executor::run(options).await?;
    Ok(())
}

/// `ctx` turned into a client of the cluster at `url`: same functions, settings and tables
/// (tables must be files the executors can read). A query waits up to `timeout` (default
/// [`crate::cluster::DEFAULT_CLUSTER_TIMEOUT`]) for a live executor, saying so on stderr, and
/// then fails.
pub async fn connect(
    ctx: SessionContext,
    url: &str,
    timeout: Option<Duration>,
) -> CliResult<SessionContext> {
    let on_wait: crate::cluster::watch::OnWait =
        Arc::new(|line: &str| eprintln!("sparse-knn: {line}"));
    crate::cluster::remote_context_with(
        url,
        ctx.state(),
        timeout.unwrap_or(crate::cluster::DEFAULT_CLUSTER_TIMEOUT),
        Some(on_wait),
    )
    .await
    .map_err(|e| CliError(format!("--cluster {url}: {}", e.strip_backtrace())))
}
