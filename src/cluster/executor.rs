//! `sparse-knn executor`: a Ballista executor that runs this crate's operators, waits for its
//! scheduler and registers again after the scheduler restarts.
//!
//! Ballista's executor process ([`start_executor_process`]) connects to its scheduler once and
//! registers; afterwards its heartbeat (every [`ExecutorOptions::heartbeat_interval`]) registers
//! it again with a scheduler that no longer knows it (one that restarted), and after 5 heartbeats
//! in a row go unanswered it stops its services and returns. [`run`] wraps it in a loop: wait for
//! the scheduler (up to [`ExecutorOptions::scheduler_wait`], with a line on stderr), start the
//! process, and when it returns without having been asked to stop, say so and wait again. Ctrl-C
//! or SIGTERM stop the executor at any point.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
use ballista_executor::executor_server::TERMINATING;
use datafusion::common::{DataFusionError, Result};
use tokio::sync::watch;

use super::codec::{SparseKnnLogicalCodec, SparseKnnPhysicalCodec};
use super::session::{executor_session_config, function_registry, MAX_MESSAGE_BYTES};

/// How often an executor tries its scheduler again while it waits for it.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(500);

/// How long an executor waits for its scheduler by default.
pub const DEFAULT_SCHEDULER_WAIT: Duration = Duration::from_secs(120);

/// How often an executor tells its scheduler it is alive by default (Ballista's default is 60 s;
/// the scheduler's executor timeout must be several of these).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

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
    /// How long to wait for the scheduler, at the start and after losing it (zero: one try).
    pub scheduler_wait: Duration,
    /// How often to send the scheduler a heartbeat (whole seconds, at least 1).
    pub heartbeat_interval: Duration,
}

impl ExecutorOptions {
    fn scheduler(&self) -> String {
        format!("{}:{}", self.scheduler_host, self.scheduler_port)
    }
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
        // One try: `run` waits for the scheduler itself (Ballista's own retry loop, with a
        // timeout above 0, does not end while the scheduler is away).
        scheduler_connect_timeout_seconds: 0,
        executor_heartbeat_interval_seconds: options.heartbeat_interval.as_secs().max(1),
        vcores: options.concurrency,
        work_dir: options.work_dir.clone(),
        print_thread_info: false,
        grpc_max_decoding_message_size: MAX_MESSAGE_BYTES as u32,
        grpc_max_encoding_message_size: MAX_MESSAGE_BYTES as u32,
        override_config_producer: Some(Arc::new(executor_session_config)),
        override_logical_codec: Some(Arc::new(SparseKnnLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(SparseKnnPhysicalCodec::default())),
        override_function_registry: Some(Arc::new(function_registry())),
        ..Default::default()
    }
}

/// A receiver that turns true on Ctrl-C or SIGTERM.
fn stop_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        let _ = tx.send(true);
    });
    rx
}

/// Returns once something listens at the scheduler's address; fails when nothing has for
/// `options.scheduler_wait` since `since`. Says once on stderr that it waits.
async fn wait_for_scheduler(options: &ExecutorOptions, since: Instant) -> Result<()> {
    let scheduler = options.scheduler();
    let mut told = false;
    loop {
        let connect = tokio::net::TcpStream::connect((
            options.scheduler_host.as_str(),
            options.scheduler_port,
        ));
        let why = match tokio::time::timeout(Duration::from_secs(2), connect).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer in 2 s".to_string(),
        };
        if since.elapsed() >= options.scheduler_wait {
            let waited = if options.scheduler_wait.is_zero() {
                String::new()
            } else {
                format!(
                    " (waited {} s; --scheduler-wait sets how long)",
                    since.elapsed().as_secs()
                )
            };
            return Err(DataFusionError::Execution(format!(
                "cannot reach the scheduler at {scheduler}: {why}{waited}"
            )));
        }
        if !told {
            told = true;
            let left = options.scheduler_wait.saturating_sub(since.elapsed());
            eprintln!(
                "sparse-knn executor: waiting for the scheduler at {scheduler} ({why}); trying \
                 every {:.1} s for up to {} s more",
                RETRY_INTERVAL.as_secs_f64(),
                left.as_secs()
            );
        }
        tokio::time::sleep(RETRY_INTERVAL).await;
    }
}

/// Fails unless both ports can be bound (after a restart, waits up to 10 s for the previous
/// process's servers to let them go).
async fn check_ports(options: &ExecutorOptions, wait: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let mut failure = None;
        for (what, port) in [("--port", options.port), ("--grpc-port", options.grpc_port)] {
            if let Err(e) = std::net::TcpListener::bind((options.bind_host.as_str(), port)) {
                failure = Some(format!(
                    "executor: cannot listen on {}:{port} ({what}): {e}",
                    options.bind_host
                ));
                break;
            }
        }
        match failure {
            None => return Ok(()),
            Some(e) if start.elapsed() >= wait => return Err(DataFusionError::Execution(e)),
            Some(_) => tokio::time::sleep(RETRY_INTERVAL).await,
        }
    }
}

/// Runs an executor until the process is stopped (Ctrl-C, SIGTERM), waiting for its scheduler
/// at the start and whenever it loses it; fails when the scheduler cannot be reached for
/// `options.scheduler_wait`, or a port cannot be bound.
pub async fn run(options: ExecutorOptions) -> Result<()> {
    if let Some(dir) = &options.work_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            DataFusionError::Execution(format!("executor: cannot create --work-dir {dir}: {e}"))
        })?;
    }
    check_ports(&options, Duration::ZERO).await?;
    let scheduler = options.scheduler();
    eprintln!(
        "sparse-knn executor on {}:{} (grpc {}), scheduler {scheduler}, {} task(s) at a time",
        options.bind_host, options.port, options.grpc_port, options.concurrency
    );
    // One id for the executor's whole life, so that the scheduler sees the same executor come
    // back.
    let config = Arc::new(executor_config(&options));
    let mut stop = stop_signal();
    // Since when the executor has been without a scheduler that took its registration.
    let mut waiting_since = Instant::now();
    let mut restarted = false;
    // Whether the current wait has said that a registration failed.
    let mut told_register = false;
    let mut failed_registrations = 0u32;
    loop {
        tokio::select! {
            r = wait_for_scheduler(&options, waiting_since) => r?,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
        if restarted {
            check_ports(&options, Duration::from_secs(10)).await?;
        }
        // Ballista marks the process as terminating when its services stop; a new start is not.
        TERMINATING.store(false, Ordering::Release);
        let started = Instant::now();
        let mut process = Box::pin(start_executor_process(Arc::clone(&config)));
        let result = tokio::select! {
            r = &mut process => r,
            _ = stop.wait_for(|s| *s) => {
                // Ballista saw the signal too and stops its services; let it finish.
                let _ = process.await;
                return Ok(());
            }
        };
        // A signal that Ballista saw first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        if *stop.borrow() {
            return Ok(());
        }
        restarted = true;
        match result {
            // The services stopped: heartbeats went unanswered (the scheduler is gone).
            Ok(()) => {
                waiting_since = Instant::now();
                told_register = false;
                failed_registrations = 0;
                eprintln!(
                    "sparse-knn executor: lost the scheduler at {scheduler} (5 heartbeats in a \
                     row unanswered, after {} s registered); waiting for it to come back",
                    started.elapsed().as_secs()
                );
            }
            // Connecting or registering failed (a scheduler still starting, or gone again).
            Err(e) => {
                if waiting_since.elapsed() >= options.scheduler_wait {
                    return Err(DataFusionError::Execution(format!(
                        "executor: cannot register with the scheduler at {scheduler}: {e}"
                    )));
                }
                if !told_register {
                    told_register = true;
                    eprintln!(
                        "sparse-knn executor: cannot register with the scheduler at \
                         {scheduler} yet ({e}); trying again"
                    );
                }
                // Each failed registration is logged by Ballista: back off up to 5 s.
                failed_registrations += 1;
                let pause = RETRY_INTERVAL * 2u32.pow(failed_registrations.min(4));
                tokio::select! {
                    _ = tokio::time::sleep(pause.min(Duration::from_secs(5))) => {}
                    _ = stop.wait_for(|s| *s) => return Ok(()),
                }
            }
        }
    }
}
