//! knn_join and radius_join on Apache Ballista (src/cluster):
//! - every sql-example on an in-process cluster (Ballista's standalone mode: scheduler and
//!   executor in this process) gives the local engine's results;
//! - `SET sparse_knn.*` reaches the executors;
//! - `right_shards` gives the same answers as one shard, ties included, locally and on a cluster;
//! - one scheduler and two executors as separate `sparse-knn` processes: `sql --cluster` answers
//!   equal the local ones, and both executors ran tasks of the join (their work folders hold the
//!   shuffle files of the join's partitions they ran);
//! - a cluster that survives its own start and the loss of a part (issue 37): executors started
//!   before the scheduler wait for it; executors register again with a restarted scheduler
//!   (through their heartbeat, or by starting over after losing it); one of two executors killed
//!   during a join leaves the answer equal to the local one; a query with no executor, or that
//!   loses its only one, fails within a bounded time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::DFParser;
use datafusion_sparse_knn::cluster::standalone_context;
use datafusion_sparse_knn::session_context;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The KOS bag-of-words table (3430 documents), as a Parquet table the executors read.
const KOS: &str = "CREATE EXTERNAL TABLE kos STORED AS PARQUET LOCATION 'data/kos_bow.parquet';";

/// Rows as text cells.
fn rows(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for batch in batches {
        let formatters: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for r in 0..batch.num_rows() {
            out.push(formatters.iter().map(|f| f.value(r).to_string()).collect());
        }
    }
    out
}

/// Runs every statement of `text`; the rows of each statement that returns any, sorted (a
/// query without ORDER BY may come back in any order from a cluster).
async fn run_script(ctx: &SessionContext, text: &str) -> Vec<Vec<Vec<String>>> {
    let statements = DFParser::parse_sql(text).unwrap();
    let mut results = Vec::new();
    for statement in statements {
        let shown = statement.to_string();
        let plan = ctx
            .state()
            .statement_to_plan(statement)
            .await
            .unwrap_or_else(|e| panic!("planning {shown}: {e}"));
        let batches = ctx
            .execute_logical_plan(plan)
            .await
            .unwrap_or_else(|e| panic!("{shown}: {e}"))
            .collect()
            .await
            .unwrap_or_else(|e| panic!("running {shown}: {e}"));
        let mut r = rows(&batches);
        if !r.is_empty() {
            r.sort();
            results.push(r);
        }
    }
    results
}

/// Cells equal as text, or as numbers within a relative 1e-9 (aggregates over differently
/// partitioned inputs add in another order).
fn same(a: &[Vec<Vec<String>>], b: &[Vec<Vec<String>>]) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{} results against {}", a.len(), b.len()));
    }
    for (q, (x, y)) in a.iter().zip(b).enumerate() {
        if x.len() != y.len() {
            return Err(format!("result {q}: {} rows against {}", x.len(), y.len()));
        }
        for (row_x, row_y) in x.iter().zip(y) {
            for (cx, cy) in row_x.iter().zip(row_y) {
                let close = match (cx.parse::<f64>(), cy.parse::<f64>()) {
                    (Ok(u), Ok(v)) => (u - v).abs() <= 1e-9 * u.abs().max(v.abs()).max(1.0),
                    _ => false,
                };
                if cx != cy && !close {
                    return Err(format!("result {q}: row {row_x:?} against {row_y:?}"));
                }
            }
        }
    }
    Ok(())
}

fn in_root() {
    std::env::set_current_dir(ROOT).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_examples_on_a_standalone_cluster_equal_the_local_engine() {
    let _cluster = crate::common::IN_PROCESS_CLUSTER.lock().await;
    in_root();
    let mut files: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("sql-examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let local = run_script(&session_context(), &text).await;
        let cluster = standalone_context(2).await.unwrap();
        let remote = run_script(&cluster, &text).await;
        assert!(!local.is_empty(), "{}: no query results", file.display());
        if let Err(e) = same(&local, &remote) {
            panic!(
                "{}: the cluster differs from the local engine: {e}",
                file.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_travel_to_the_executors() {
    let _cluster = crate::common::IN_PROCESS_CLUSTER.lock().await;
    in_root();
    // sparse_distance reads its defaults from the session config where it runs: on the
    // executors. With p=3 set on the client, the cluster must answer what the local engine does
    // with p=3, which is not what it does with p=2.
    let query =
        "SELECT a.doc_id AS a, b.doc_id AS b, sparse_distance(a.vec, b.vec, 'minkowski') AS d \
                 FROM kos a JOIN kos b ON b.doc_id = a.doc_id + 1 \
                 WHERE a.doc_id <= 20";
    let script = |p: &str| format!("{KOS} SET sparse_knn.p = {p}; {query};");
    let local_p3 = run_script(&session_context(), &script("3")).await;
    let local_p2 = run_script(&session_context(), &script("2")).await;
    assert_ne!(local_p3, local_p2, "p must change the distances");
    let cluster = standalone_context(1).await.unwrap();
    let remote_p3 = run_script(&cluster, &script("3")).await;
    same(&local_p3, &remote_p3).unwrap();
    // knn_join takes its defaults when the client plans it, and they travel in the plan.
    let knn = "SELECT query_doc_id, neighbor_doc_id, distance, rank FROM knn_join(\
               (SELECT * FROM kos WHERE doc_id <= 50), kos, 'minkowski', 3)";
    let local = run_script(
        &session_context(),
        &format!("{KOS} SET sparse_knn.p = 3; {knn};"),
    )
    .await;
    // (`kos` is already registered in the cluster's client session.)
    let remote = run_script(&cluster, &format!("SET sparse_knn.p = 3; {knn};")).await;
    same(&local, &remote).unwrap();
    let local_p2 = run_script(&session_context(), &format!("{KOS} {knn};")).await;
    assert_ne!(local, local_p2);
}

/// The same join with and without `right_shards`: identical rows (distances to the bit, ranks,
/// ties in right-row order).
async fn assert_shards_change_nothing(ctx: &SessionContext, call: &str, shards: usize) {
    let sql = |options: &str| format!("SELECT * FROM {}", call.replace("OPTIONS", options));
    let one = run_script(ctx, &sql("")).await;
    let many = run_script(ctx, &sql(&format!(", right_shards={shards}"))).await;
    assert!(!one.is_empty() && !one[0].is_empty(), "{call}: no rows");
    assert_eq!(one, many, "{call}: right_shards={shards} differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_right_side_equals_one_shard() {
    in_root();
    let ctx = session_context();
    run_script(
        &ctx,
        &format!("{KOS} CREATE TABLE docs AS SELECT doc_id, vec FROM kos WHERE doc_id <= 400;"),
    )
    .await;
    // jaccard on word sets has many exact ties; dot is a similarity (largest first).
    for call in [
        "knn_join(docs, docs, 'jaccard', 7, 'device=cpu OPTIONS')",
        "knn_join(docs, docs, 'jaccard', 7, 'exclude_self=true OPTIONS')",
        "knn_join(docs, docs, 'dot', 5, 'exclude_self=true OPTIONS')",
        "knn_join((SELECT * FROM docs WHERE doc_id < 50), docs, 'cosine', 500, 'device=cpu OPTIONS')",
        "radius_join(docs, docs, 'jaccard', 0.8, 'device=cpu OPTIONS')",
        "radius_join(docs, docs, 'cosine', 0.7, 'exclude_self=true OPTIONS')",
    ] {
        for shards in [2, 3, 7] {
            assert_shards_change_nothing(&ctx, call, shards).await;
        }
    }
    // The plan says so.
    let plan = run_script(
        &ctx,
        "EXPLAIN SELECT * FROM knn_join(docs, docs, 'cosine', 3, 'right_shards=3')",
    )
    .await;
    let text = format!("{plan:?}");
    assert!(
        text.contains("ShardedKnnJoinExec") && text.contains("right_shards=3"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_right_side_on_a_cluster_equals_the_local_engine() {
    let _cluster = crate::common::IN_PROCESS_CLUSTER.lock().await;
    in_root();
    let cluster = standalone_context(2).await.unwrap();
    let sql = format!(
        "{KOS} SELECT query_doc_id, neighbor_doc_id, distance, rank FROM knn_join(\
         (SELECT * FROM kos WHERE doc_id <= 300), (SELECT * FROM kos WHERE doc_id <= 600), \
         'jaccard', 6, 'right_shards=3');"
    );
    let local = run_script(&session_context(), &sql.replace(", 'right_shards=3'", "")).await;
    let remote = run_script(&cluster, &sql).await;
    assert!(
        local == remote,
        "right_shards=3 on the cluster differs from the local engine"
    );
    // doc_id runs from 0: 301 left rows, 6 neighbours each.
    assert_eq!(local.first().map(Vec::len), Some(301 * 6));
}

// ---- separate processes ----------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16, child: &mut Child, what: &str) {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("{what} exited ({status}): {err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what} does not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The processes of a test cluster, killed when dropped (also when the test fails).
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sparse-knn"));
    c.current_dir(ROOT);
    c
}

fn sql(args: &[&str]) -> String {
    let out = bin().arg("sql").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "sparse-knn sql {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    // Rows of a query without ORDER BY come in any order; the header stays first.
    lines[1..].sort();
    lines.join("\n")
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn scheduler_and_two_executor_processes_run_the_joins() {
    let tmp = tempfile::tempdir().unwrap();
    // The left side as 4 Parquet files: 4 partitions, so both executors get tasks.
    let left = tmp.path().join("left");
    std::fs::create_dir(&left).unwrap();
    for i in 0..4 {
        let path = left.join(format!("part-{i}.parquet"));
        sql(&[
            "-c",
            &format!(
                "COPY (SELECT doc_id, vec FROM 'data/kos_bow.parquet' WHERE doc_id % 4 = {i} AND doc_id < 1600 ORDER BY doc_id) TO '{}' STORED AS PARQUET",
                path.display()
            ),
        ]);
    }
    let scheduler_port = free_port();
    let mut procs = Processes(Vec::new());
    let scheduler = bin()
        .args([
            "scheduler",
            "--bind",
            &format!("127.0.0.1:{scheduler_port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    procs.0.push(scheduler);
    wait_for_port(scheduler_port, procs.0.last_mut().unwrap(), "scheduler");
    let mut work_dirs = Vec::new();
    for e in 0..2 {
        let (port, grpc) = (free_port(), free_port());
        let work = tmp.path().join(format!("executor-{e}"));
        let child = bin()
            .args([
                "executor",
                "--scheduler",
                &format!("127.0.0.1:{scheduler_port}"),
                "--port",
                &port.to_string(),
                "--grpc-port",
                &grpc.to_string(),
                "--concurrency",
                "1",
                "--work-dir",
                work.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        procs.0.push(child);
        wait_for_port(port, procs.0.last_mut().unwrap(), "executor");
        wait_for_port(grpc, procs.0.last_mut().unwrap(), "executor");
        work_dirs.push(work);
    }
    // Registration follows the listening ports closely.
    std::thread::sleep(Duration::from_secs(1));
    let url = format!("df://127.0.0.1:{scheduler_port}");
    let left = left.to_str().unwrap();

    let knn = format!(
        "SELECT query_doc_id, neighbor_doc_id, distance, rank FROM knn_join('{left}', 'data/kos_bow.parquet', 'cosine', 5)"
    );
    let local = sql(&["--format", "csv", "-c", &knn]);
    let remote = sql(&["--cluster", &url, "--format", "csv", "-c", &knn]);
    // doc_id runs from 0: 1600 left rows, 5 neighbours each, and a header.
    assert_eq!(local.lines().count(), 1 + 1600 * 5, "{local:.300}");
    assert!(local == remote, "knn_join on the cluster differs");
    // Both executors ran tasks of that job (it is one stage: the join over the left side's
    // partitions); each task leaves its shuffle output in its executor's work folder.
    for dir in &work_dirs {
        let files = files_under(dir);
        assert!(
            !files.is_empty(),
            "executor with work folder {} ran no task",
            dir.display()
        );
    }
    let after_knn: Vec<usize> = work_dirs.iter().map(|d| files_under(d).len()).collect();

    let radius = format!(
        "SELECT query_doc_id, neighbor_doc_id, distance FROM radius_join('{left}', 'data/kos_bow.parquet', 'cosine', 0.5)"
    );
    let local = sql(&["--format", "csv", "-c", &radius]);
    let remote = sql(&["--cluster", &url, "--format", "csv", "-c", &radius]);
    // Every left row is also a right row (distance 0), so there are more pairs than left rows.
    assert!(local.lines().count() > 1 + 1600, "{local:.300}");
    assert!(local == remote, "radius_join on the cluster differs");
    for (dir, before) in work_dirs.iter().zip(&after_knn) {
        assert!(
            files_under(dir).len() > *before,
            "executor with work folder {} ran no task of the radius_join",
            dir.display()
        );
    }
    // exclude_self counts row positions over the whole left input (4 files), and right_shards
    // spreads the right side: both read inputs whole inside a task.
    for options in ["exclude_self=true", "exclude_self=true, right_shards=3"] {
        let graph = format!(
            "SELECT query_doc_id, neighbor_doc_id, distance, rank FROM knn_join('{left}', '{left}', 'cosine', 3, '{options}')"
        );
        let local = sql(&["--format", "csv", "-c", &graph]);
        let remote = sql(&["--cluster", &url, "--format", "csv", "-c", &graph]);
        assert_eq!(local.lines().count(), 1 + 1600 * 3, "{local:.300}");
        assert!(
            local == remote,
            "knn_join with {options} on the cluster differs"
        );
    }
    drop(procs);
}

#[test]
fn unreachable_scheduler_is_a_one_line_error() {
    let port = free_port();
    let start = Instant::now();
    let out = bin()
        .args([
            "sql",
            "--cluster",
            &format!("df://127.0.0.1:{port}"),
            "-c",
            "SELECT 1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach the scheduler"), "{err}");
    let out = bin()
        .args([
            "executor",
            "--scheduler",
            &format!("127.0.0.1:{port}"),
            "--scheduler-wait",
            "0",
            "--port",
            &free_port().to_string(),
            "--grpc-port",
            &free_port().to_string(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the scheduler"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30));
}

// ---- a cluster that survives its own start and the loss of a part (issue 37) ------------------

/// A process of the test cluster whose stderr is collected as it comes; killed when dropped.
struct Logged {
    child: Child,
    stderr: Arc<Mutex<String>>,
    what: String,
}

impl Logged {
    fn spawn(mut command: Command, what: &str) -> Self {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        Self {
            child,
            stderr,
            what: what.to_string(),
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Polls until `done` holds; fails when the process exits first or after `limit`.
    fn wait_until(&mut self, limit: Duration, why: &str, mut done: impl FnMut(&Self) -> bool) {
        let start = Instant::now();
        while !done(self) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before {why}: {}",
                    self.what,
                    self.stderr()
                );
            }
            assert!(
                start.elapsed() < limit,
                "{}: not {why} after {limit:?}: {}",
                self.what,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for_stderr(&mut self, text: &str) {
        self.wait_until(Duration::from_secs(60), &format!("saying '{text}'"), |p| {
            p.stderr().contains(text)
        });
    }

    fn wait_for_port(&mut self, port: u16) {
        self.wait_until(Duration::from_secs(60), "listening", |_| {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Seconds without a heartbeat after which the test schedulers remove an executor, and the
/// test executors' heartbeat interval.
const EXECUTOR_TIMEOUT: &str = "3";
const HEARTBEAT: &str = "1";

fn start_scheduler(port: u16) -> Logged {
    let mut c = bin();
    c.args([
        "scheduler",
        "--bind",
        &format!("127.0.0.1:{port}"),
        "--executor-timeout",
        EXECUTOR_TIMEOUT,
    ]);
    let mut p = Logged::spawn(c, "scheduler");
    p.wait_for_port(port);
    p
}

/// An executor with one task at a time, its shuffle files in `work`; not waited for.
fn spawn_executor(scheduler_port: u16, work: &Path, name: &str) -> Logged {
    let mut c = bin();
    c.args([
        "executor",
        "--scheduler",
        &format!("127.0.0.1:{scheduler_port}"),
        "--port",
        &free_port().to_string(),
        "--grpc-port",
        &free_port().to_string(),
        "--concurrency",
        "1",
        "--heartbeat-interval",
        HEARTBEAT,
        "--scheduler-wait",
        "60",
        "--work-dir",
        work.to_str().unwrap(),
    ]);
    Logged::spawn(c, name)
}

/// The scheduler's count of live executors, from its `/readyz` answer ("ready: N executors
/// registered", "not ready: N/M executors registered"); `None` when it does not answer.
fn alive_executors(port: u16) -> Option<usize> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let line = answer
        .lines()
        .find(|l| l.contains("executors registered"))?;
    let digits: String = line
        .split(": ")
        .nth(1)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

fn wait_for_executors(scheduler: &mut Logged, port: u16, n: usize) {
    scheduler.wait_until(
        Duration::from_secs(60),
        &format!("{n} executors registered"),
        |_| alive_executors(port) == Some(n),
    );
}

/// `parts` Parquet files of the KOS rows with `doc_id < rows` (row `i` in file `i % parts`), in
/// a new folder `dir/name`; its path.
fn split_kos(dir: &Path, name: &str, parts: usize, rows: usize) -> String {
    let folder = dir.join(name);
    std::fs::create_dir(&folder).unwrap();
    let copies: Vec<String> = (0..parts)
        .map(|i| {
            format!(
                "COPY (SELECT doc_id, vec FROM 'data/kos_bow.parquet' WHERE doc_id % {parts} = {i} \
                 AND doc_id < {rows} ORDER BY doc_id) TO '{}' STORED AS PARQUET;",
                folder.join(format!("part-{i:02}.parquet")).display()
            )
        })
        .collect();
    sql(&["-c", &copies.join(" ")]);
    folder.to_str().unwrap().to_string()
}

fn knn_query(left: &str, k: usize) -> String {
    format!(
        "SELECT query_doc_id, neighbor_doc_id, distance, rank FROM knn_join('{left}', 'data/kos_bow.parquet', 'cosine', {k})"
    )
}

/// `n` executors, their work folders `dir/e0`, `dir/e1`, ...
fn spawn_executors(port: u16, dir: &Path, n: usize) -> Vec<Logged> {
    (0..n)
        .map(|e| spawn_executor(port, &dir.join(format!("e{e}")), &format!("executor {e}")))
        .collect()
}

/// A temporary folder with the first `rows` KOS rows in `parts` files, the knn query over them
/// and its local answer.
fn knn_setup(parts: usize, rows: usize, k: usize) -> (tempfile::TempDir, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let left = split_kos(tmp.path(), "left", parts, rows);
    let query = knn_query(&left, k);
    let local = sql(&["--format", "csv", "-c", &query]);
    assert_eq!(
        local.lines().count(),
        1 + rows.min(3430) * k,
        "{local:.300}"
    );
    (tmp, query, local)
}

/// Starts a scheduler on `port`, waits for `executors` to register and checks that `query` on
/// the cluster gives `local`; the scheduler.
fn scheduler_answering(
    port: u16,
    executors: usize,
    query: &str,
    local: &str,
    when: &str,
) -> Logged {
    let mut scheduler = start_scheduler(port);
    wait_for_executors(&mut scheduler, port, executors);
    assert!(
        on_cluster(port, query) == local,
        "the cluster's answer {when} differs from the local one"
    );
    scheduler
}

/// Kills `executor` (SIGKILL) once it has started on the job of `client` (its first task's
/// output is in its work folder `work`) while the client still waits; when.
fn kill_once_running(executor: &mut Logged, work: &Path, client: &mut Child) -> Instant {
    executor.wait_until(Duration::from_secs(60), "running a task", |_| {
        !files_under(work).is_empty()
    });
    assert!(
        client.try_wait().unwrap().is_none(),
        "the query ended before its executor could be killed"
    );
    let killed_at = Instant::now();
    executor.child.kill().unwrap();
    executor.child.wait().unwrap();
    killed_at
}

fn on_cluster(port: u16, query: &str) -> String {
    let url = format!("df://127.0.0.1:{port}");
    sql(&["--cluster", &url, "--format", "csv", "-c", query])
}

#[test]
fn executors_started_before_the_scheduler_wait_for_it() {
    let (tmp, query, local) = knn_setup(4, 400, 4);

    let port = free_port();
    let mut executors = spawn_executors(port, tmp.path(), 2);
    // Each says it waits (and keeps waiting: it has not exited).
    for e in &mut executors {
        e.wait_for_stderr("waiting for the scheduler at 127.0.0.1:");
    }
    let scheduler = scheduler_answering(port, 2, &query, &local, "started executors-first");
    for (e, executor) in executors.iter().enumerate() {
        assert!(
            !files_under(&tmp.path().join(format!("e{e}"))).is_empty(),
            "executor {e} ran no task: {}",
            executor.stderr()
        );
    }
    let said = scheduler.stderr();
    assert!(said.matches(" registered").count() >= 2, "{said}");
}

#[test]
fn executors_register_again_after_the_scheduler_restarts() {
    let (tmp, query, local) = knn_setup(4, 400, 3);

    let port = free_port();
    let mut scheduler = start_scheduler(port);
    let mut executors = spawn_executors(port, tmp.path(), 2);
    wait_for_executors(&mut scheduler, port, 2);
    assert!(on_cluster(port, &query) == local, "first query differs");

    // A quick restart: the executors' next heartbeat registers them with the new scheduler.
    drop(scheduler);
    let scheduler = scheduler_answering(port, 2, &query, &local, "after a quick restart");

    // A long outage: after 5 unanswered heartbeats each executor stops its services and waits
    // for the scheduler again, then registers anew.
    drop(scheduler);
    for e in &mut executors {
        e.wait_for_stderr("lost the scheduler at 127.0.0.1:");
    }
    scheduler_answering(port, 2, &query, &local, "after a long outage");
}

#[test]
fn an_executor_killed_during_a_join_leaves_the_answer_unchanged() {
    // All KOS rows in 24 files: 24 tasks, so that each executor (one task at a time) has many.
    let (tmp, query, local) = knn_setup(24, 3430, 5);

    let port = free_port();
    let mut scheduler = start_scheduler(port);
    let (work_a, work_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let _a = spawn_executor(port, &work_a, "executor a");
    let mut b = spawn_executor(port, &work_b, "executor b");
    wait_for_executors(&mut scheduler, port, 2);

    let url = format!("df://127.0.0.1:{port}");
    let mut client = bin()
        .args(["sql", "--cluster", &url, "--format", "csv", "-c", &query])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // b has more of the 24 tasks to come: the job cannot end without the scheduler noticing.
    let killed_at = kill_once_running(&mut b, &work_b, &mut client);

    let out = client.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the join failed: {err}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1..].sort();
    assert!(
        lines.join("\n") == local,
        "the join that lost an executor differs from the local one"
    );
    // The scheduler removed b after its heartbeats stopped, and said so.
    scheduler.wait_for_stderr("removed");
    assert!(
        killed_at.elapsed() < Duration::from_secs(60),
        "{:?}",
        killed_at.elapsed()
    );
}

#[test]
fn a_query_without_an_executor_fails_in_bounded_time() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut scheduler = start_scheduler(port);
    let url = format!("df://127.0.0.1:{port}");
    let query = knn_query("data/kos_bow.parquet", 3);

    // No executor at all: fails after --cluster-timeout.
    let start = Instant::now();
    let out = bin()
        .args([
            "sql",
            "--cluster",
            &url,
            "--cluster-timeout",
            "2",
            "-c",
            &query,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains("no executor is registered with the scheduler"),
        "{err}"
    );
    assert!(err.contains("waiting up to 2 s"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );

    // Its only executor lost during the query: fails too, within a bounded time.
    let left = split_kos(tmp.path(), "left", 24, 3430);
    let work = tmp.path().join("e");
    let mut executor = spawn_executor(port, &work, "executor");
    wait_for_executors(&mut scheduler, port, 1);
    let query = knn_query(&left, 5);
    let mut client = bin()
        .args([
            "sql",
            "--cluster",
            &url,
            "--cluster-timeout",
            "2",
            "-c",
            &query,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let killed_at = kill_once_running(&mut executor, &work, &mut client);
    let out = client.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the query lost its executor and succeeded"
    );
    assert!(
        err.contains("no executor is registered") || err.contains("executors were lost"),
        "{err}"
    );
    assert!(
        killed_at.elapsed() < Duration::from_secs(30),
        "{:?}: {err}",
        killed_at.elapsed()
    );
}
