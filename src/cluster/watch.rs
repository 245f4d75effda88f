//! A client's query on a cluster fails, within a bounded time, when there is no executor to run
//! it: Ballista queues a job that finds no executor and waits for one forever.
//!
//! [`WatchedPlanner`] wraps the client session's query planner (Ballista's): every plan it makes
//! that runs on the cluster gets a [`WatchedExec`] on top, which
//! - before the job is submitted, asks the scheduler how many executors are alive and waits up to
//!   [`ClusterWatch::timeout`] for one (saying so once through [`ClusterWatch::on_wait`]), then
//!   fails with "no executor is registered with the scheduler at HOST:PORT";
//! - until the job's first rows come back, asks again every [`POLL`]: when no executor has been
//!   alive (or the scheduler has not answered) for `timeout` in a row, it cancels the job and
//!   fails the same way. An executor lost while others live is Ballista's to handle: it runs
//!   the lost tasks again on the others once the scheduler stops hearing from it.
//!
//! The scheduler's count of live executors is read from its `/readyz` endpoint (plain HTTP on its
//! gRPC port: "ready: N executors registered"); Ballista 55's gRPC API has no call that lists
//! executors.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballista_core::execution_plans::DistributedQueryExec;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::CancelJobParams;
use datafusion::catalog::Session;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use datafusion_proto::protobuf::LogicalPlanNode;
use futures::{StreamExt, TryStreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a query waits for a live executor by default.
pub const DEFAULT_CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a waiting query asks the scheduler for its live executors.
pub const POLL: Duration = Duration::from_millis(500);

/// How long one question to the scheduler may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What a waiting query is told when it starts waiting (a line, for a person).
pub type OnWait = Arc<dyn Fn(&str) + Send + Sync>;

/// What a query on the scheduler at `host:port` waits for, and for how long.
#[derive(Clone)]
pub struct ClusterWatch {
    pub host: String,
    pub port: u16,
    /// How long a query waits with no live executor (or no answer from the scheduler) before it
    /// fails.
    pub timeout: Duration,
    /// Told once per query, when it starts waiting for an executor (the CLI prints it).
    pub on_wait: Option<OnWait>,
}

impl fmt::Debug for ClusterWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterWatch")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What the scheduler said about its executors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Executors {
    /// This many executors are alive (registered, and heard from within the scheduler's executor
    /// timeout).
    Alive(usize),
    /// The scheduler did not answer (the text says why).
    NoAnswer(String),
    /// Something listens but does not answer as Ballista 55's `/readyz` (an older scheduler, or
    /// one without HTTP routes): nothing to go by, so no waiting.
    Unknown,
}

/// The live executors of the scheduler at `host:port`, from its `/readyz` endpoint.
pub async fn alive_executors(host: &str, port: u16) -> Executors {
    let connect = tokio::net::TcpStream::connect((host, port));
    let mut stream = match tokio::time::timeout(ASK_TIMEOUT, connect).await {
        Err(_) => return Executors::NoAnswer(format!("no answer in {} s", ASK_TIMEOUT.as_secs())),
        Ok(Err(e)) => return Executors::NoAnswer(e.to_string()),
        Ok(Ok(stream)) => stream,
    };
    let ask = async {
        let request =
            format!("GET /readyz HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    };
    // Something listens: what it says, if it is a `/readyz` answer (a gRPC-only server, like
    // Ballista's in-process scheduler, closes the connection).
    match tokio::time::timeout(ASK_TIMEOUT, ask).await {
        Ok(Ok(text)) => parse_readyz(&text),
        _ => Executors::Unknown,
    }
}

/// The count in a `/readyz` answer: "ready: N executors registered" or "not ready: N/M
/// executors registered".
fn parse_readyz(answer: &str) -> Executors {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let Some(line) = body.lines().find(|l| l.contains("executors registered")) else {
        return Executors::Unknown;
    };
    let count = line
        .split(": ")
        .nth(1)
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|digits| digits.parse().ok());
    match count {
        Some(n) => Executors::Alive(n),
        None => Executors::Unknown,
    }
}

impl ClusterWatch {
    fn scheduler(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The error of a query that waited `waited` with `last` as the scheduler's last word.
    fn give_up(&self, last: &Executors, waited: Duration, during: &str) -> DataFusionError {
        let secs = waited.as_secs_f64().round() as u64;
        let scheduler = self.scheduler();
        DataFusionError::Execution(match last {
            Executors::NoAnswer(why) => {
                format!("the scheduler at {scheduler} did not answer for {secs} s {during} ({why})")
            }
            _ => format!(
                "no executor is registered with the scheduler at {scheduler} (waited {secs} s \
                 {during}; start one with `sparse-knn executor --scheduler {scheduler}`)"
            ),
        })
    }

    /// Returns once the scheduler has a live executor; fails after [`Self::timeout`] without one.
    pub async fn wait_for_executor(&self) -> Result<()> {
        let start = Instant::now();
        let mut told = false;
        loop {
            let now = alive_executors(&self.host, self.port).await;
            match &now {
                Executors::Alive(n) if *n > 0 => return Ok(()),
                Executors::Unknown => return Ok(()),
                _ => {}
            }
            if start.elapsed() >= self.timeout {
                return Err(self.give_up(&now, start.elapsed(), "before the query"));
            }
            if !told {
                told = true;
                if let Some(on_wait) = &self.on_wait {
                    on_wait(&match &now {
                        Executors::NoAnswer(why) => format!(
                            "the scheduler at {} does not answer ({why}); waiting up to {} s",
                            self.scheduler(),
                            self.timeout.as_secs()
                        ),
                        _ => format!(
                            "no executor is registered with the scheduler at {} yet; waiting up \
                             to {} s for one",
                            self.scheduler(),
                            self.timeout.as_secs()
                        ),
                    });
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Cancels the job of `plan` on the scheduler, if it was submitted (best effort).
    async fn cancel(&self, plan: &Arc<dyn ExecutionPlan>) {
        let Some(job) = submitted_job(plan) else {
            return;
        };
        let url = format!("http://{}", self.scheduler());
        let cancel = async {
            let mut client = SchedulerGrpcClient::connect(url).await.ok()?;
            client
                .cancel_job(CancelJobParams {
                    job_id: job.clone(),
                })
                .await
                .ok()
        };
        if tokio::time::timeout(ASK_TIMEOUT, cancel).await.is_err() {
            log::warn!("could not cancel job {job} on the scheduler");
        }
    }
}

/// The job id of the Ballista query in `plan`, once the scheduler has accepted it.
fn submitted_job(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    if let Some(query) = plan.downcast_ref::<DistributedQueryExec<LogicalPlanNode>>() {
        return query.job_id().map(|id| id.as_str().to_string());
    }
    plan.children().into_iter().find_map(submitted_job)
}

/// Whether `plan` runs (part of) its work on the cluster.
fn runs_on_cluster(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.name() == "DistributedQueryExec" || plan.children().into_iter().any(runs_on_cluster)
}

/// A query planner that puts a [`WatchedExec`] over the plans of `inner` that run on the
/// cluster.
#[derive(Debug)]
pub struct WatchedPlanner {
    pub inner: Arc<dyn QueryPlanner + Send + Sync>,
    pub watch: ClusterWatch,
}

#[async_trait::async_trait]
impl QueryPlanner for WatchedPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self
            .inner
            .create_physical_plan(logical_plan, session_state)
            .await?;
        Ok(if runs_on_cluster(&plan) {
            Arc::new(WatchedExec::new(plan, self.watch.clone()))
        } else {
            plan
        })
    }
}

/// `input` (a Ballista query), failing when the cluster has no live executor for
/// [`ClusterWatch::timeout`] before its first rows: see the module's documentation.
#[derive(Debug)]
pub struct WatchedExec {
    input: Arc<dyn ExecutionPlan>,
    watch: ClusterWatch,
}

impl WatchedExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, watch: ClusterWatch) -> Self {
        Self { input, watch }
    }
}

impl DisplayAs for WatchedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "WatchedExec: fails after {} s with no executor",
            self.watch.timeout.as_secs()
        )
    }
}

impl ExecutionPlan for WatchedExec {
    fn name(&self) -> &str {
        "WatchedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => {
                Ok(Arc::new(Self::new(input, self.watch.clone())))
            }
            _ => internal_err!("WatchedExec takes one child"),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = Arc::clone(&self.input);
        let watch = self.watch.clone();
        let schema = self.input.schema();
        let stream = futures::stream::once(async move {
            watch.wait_for_executor().await?;
            let rows = input.execute(partition, context)?;
            Ok::<_, DataFusionError>(guarded(rows, input, watch))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// `rows`, or an error once the cluster has had no live executor for `watch.timeout` before
/// the first row came (the job is then cancelled).
fn guarded(
    rows: SendableRecordBatchStream,
    plan: Arc<dyn ExecutionPlan>,
    watch: ClusterWatch,
) -> impl futures::Stream<Item = Result<datafusion::arrow::array::RecordBatch>> + Send {
    struct State {
        rows: SendableRecordBatchStream,
        plan: Arc<dyn ExecutionPlan>,
        watch: ClusterWatch,
        /// Still waiting for the first rows (the job has not finished).
        watching: bool,
        /// Since when the scheduler has had no live executor (or not answered).
        none_since: Option<Instant>,
        done: bool,
    }
    let state = State {
        rows,
        plan,
        watch,
        watching: true,
        none_since: None,
        done: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        if !s.watching {
            return s.rows.next().await.map(|item| (item, s));
        }
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + POLL, POLL);
        loop {
            tokio::select! {
                item = s.rows.next() => {
                    s.watching = false;
                    return item.map(|item| (item, s));
                }
                _ = ticks.tick() => {
                    let now = alive_executors(&s.watch.host, s.watch.port).await;
                    match &now {
                        Executors::Alive(n) if *n > 0 => s.none_since = None,
                        Executors::Unknown => s.none_since = None,
                        _ => {
                            let since = *s.none_since.get_or_insert_with(Instant::now);
                            if since.elapsed() >= s.watch.timeout {
                                s.watch.cancel(&s.plan).await;
                                s.done = true;
                                let e = s.watch.give_up(&now, since.elapsed(), "during the query");
                                return Some((Err(e), s));
                            }
                        }
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_answers_are_read() {
        let ok =
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nready: 2 executors registered\n";
        assert_eq!(parse_readyz(ok), Executors::Alive(2));
        let none = "HTTP/1.1 503 Service Unavailable\r\n\r\nnot ready: 0/1 executors registered\n";
        assert_eq!(parse_readyz(none), Executors::Alive(0));
        assert_eq!(
            parse_readyz("HTTP/1.1 404 Not Found\r\n\r\n"),
            Executors::Unknown
        );
    }
}
