//! `sparse-knn scheduler`, `sparse-knn executor`, and the `--cluster df://HOST:PORT` session of
//! `sql` and `knn` (see docs/cluster.md).

use std::net::SocketAddr;

use clap::Args;
use datafusion::execution::context::SessionContext;

use super::{CliError, CliResult};

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// Address to listen on (clients use --cluster df://HOST:PORT, executors --scheduler).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050")]
    pub bind: String,
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
    crate::cluster::scheduler::run(address).await?;
    Ok(())
}

pub async fn run_executor(args: ExecutorArgs) -> CliResult<()> {
    let (scheduler_host, scheduler_port) = host_port("--scheduler", &args.scheduler)?;
    if args.concurrency == Some(0) {
        cli_bail!("--concurrency must be at least 1");
    }
    let options = crate::cluster::executor::ExecutorOptions {
        scheduler_host,
        scheduler_port,
        bind_host: args.bind,
        port: args.port,
        grpc_port: args.grpc_port,
        concurrency: args.concurrency.unwrap_or(0),
        work_dir: args.work_dir,
    };
    crate::cluster::executor::run(options).await?;
    Ok(())
}

/// `ctx` turned into a client of the cluster at `url`: same functions, settings and tables
/// (tables must be files the executors can read).
pub async fn connect(ctx: SessionContext, url: &str) -> CliResult<SessionContext> {
    crate::cluster::remote_context(url, ctx.state())
        .await
        .map_err(|e| CliError(format!("--cluster {url}: {}", e.strip_backtrace())))
}
