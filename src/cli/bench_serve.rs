//! `sparse-knn bench serve`: many clients against a `sparse-knn serve` server, each on its own
//! connection, running a file's statements shared out in turn; latency percentiles and
//! statements a second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bench::BenchArgs;
use super::remote::Remote;
use super::{CliError, CliResult};

pub async fn run(args: &BenchArgs) -> CliResult<()> {
    let Some(url) = args.server.as_deref() else {
        cli_bail!("bench serve: give the server with --server grpc://HOST:PORT");
    };
    let Some(file) = args.statements.as_deref() else {
        cli_bail!("bench serve: give the statements with --statements FILE (one a line)");
    };
    if args.clients == 0 {
        cli_bail!("--clients must be at least 1");
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError(format!("--statements {}: {e}", file.display())))?;
    let statements: Arc<Vec<String>> = Arc::new(
        text.lines()
            .map(|l| l.trim().trim_end_matches(';').to_string())
            .filter(|l| !l.is_empty() && !l.starts_with("--"))
            .collect(),
    );
    if statements.is_empty() {
        cli_bail!("--statements {}: no statement", file.display());
    }
    // --parameters: the one statement prepared by each client, `$1` bound to a line each.
    let parameters: Option<Arc<Vec<String>>> = match args.parameters.as_deref() {
        None => None,
        Some(path) => {
            if statements.len() != 1 {
                cli_bail!(
                    "bench serve --parameters: --statements {} holds {} statements; give the one \
                     statement to prepare (with $1)",
                    file.display(),
                    statements.len()
                );
            }
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError(format!("--parameters {}: {e}", path.display())))?;
            let values: Vec<String> = text
                .lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect();
            if values.is_empty() {
                cli_bail!("--parameters {}: no value", path.display());
            }
            Some(Arc::new(values))
        }
    };
    let token = super::serve::read_token(None)?;
    let mut remotes = Vec::new();
    for _ in 0..args.clients {
        remotes.push(Remote::connect(url, token.text().map(str::to_string), None).await?);
    }
    match &parameters {
        None => eprintln!(
            "bench serve: {} statements, {} clients, against {url}",
            statements.len(),
            args.clients
        ),
        Some(values) => eprintln!(
            "bench serve: one prepared statement run with {} values, {} clients, against {url}",
            values.len(),
            args.clients
        ),
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (client, mut remote) in remotes.into_iter().enumerate() {
        let statements = Arc::clone(&statements);
        let clients = args.clients;
        let parameters = parameters.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let Some(values) = parameters else {
                for sql in statements.iter().skip(client).step_by(clients) {
                    let at = Instant::now();
                    remote.query(sql).await?;
                    latencies.push(at.elapsed());
                }
                return Ok::<_, CliError>(latencies);
            };
            let mut prepared = remote.prepare(&statements[0]).await?;
            for value in values.iter().skip(client).step_by(clients) {
                let at = Instant::now();
                remote
                    .run_prepared(&mut prepared, parameter_row(value)?)
                    .await?;
                latencies.push(at.elapsed());
            }
            Ok::<_, CliError>(latencies)
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for task in tasks {
        let mut part = task
            .await
            .map_err(|e| CliError(format!("a client's task ended: {e}")))??;
        latencies.append(&mut part);
    }
    let wall = started.elapsed();
    latencies.sort();
    let at = |q: f64| {
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1e3
    };
    println!(
        "statements={} clients={} wall_s={:.3} per_s={:.1} p50_ms={:.2} p90_ms={:.2} p99_ms={:.2} max_ms={:.2}",
        latencies.len(),
        args.clients,
        wall.as_secs_f64(),
        latencies.len() as f64 / wall.as_secs_f64(),
        at(0.50),
        at(0.90),
        at(0.99),
        at(1.0)
    );
    Ok(())
}

/// One row binding `$1` to `value`: an Int64 where it is an integer, else Utf8.
fn parameter_row(value: &str) -> CliResult<arrow::record_batch::RecordBatch> {
    let column: arrow::array::ArrayRef = match value.parse::<i64>() {
        Ok(n) => Arc::new(arrow::array::Int64Array::from(vec![n])),
        Err(_) => Arc::new(arrow::array::StringArray::from(vec![value])),
    };
    arrow::record_batch::RecordBatch::try_from_iter([("$1", column)])
        .map_err(|e| CliError(format!("--parameters: {e}")))
}
