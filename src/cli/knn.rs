//! `sparse-knn knn`: the Parquet-to-neighbours job through the `knn_join` operator.

use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use clap::Args;
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;
use object_store::buffered::BufWriter;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::AsyncArrowWriter;
use url::Url;

use super::parquet_out::ParallelParquetWriter;
use super::{
    parquet_rows, progress_bar, register_location, table_rows, writer_properties, CliError,
    CliResult, Location, OutputFile,
};
use crate::options::{DeviceChoice, JoinOptions};

#[derive(Debug, Args)]
pub struct KnnArgs {
    /// Query rows: a Parquet file or a folder of them (local, file:// or s3://BUCKET/KEY).
    #[arg(long)]
    pub left: String,
    /// Rows searched: a Parquet file or a folder of them (local, file:// or s3://BUCKET/KEY).
    #[arg(long)]
    pub right: String,
    /// Distance, e.g. cosine, euclidean, manhattan, jensenshannon (any name or alias of the SPEC).
    #[arg(long)]
    pub metric: String,
    /// Neighbours per left row.
    #[arg(short = 'k', long)]
    pub k: u64,
    /// Parquet file to write (local, file:// or s3://BUCKET/KEY): query_*, neighbor_*,
    /// distance, rank.
    #[arg(long, short)]
    pub output: String,
    /// Join options 'key=value,...' (p, dim, device, exclude_self, left_column, right_column, ...).
    #[arg(long, default_value = "")]
    pub options: String,
    /// Where the join runs (overrides --options).
    #[arg(long, value_parser = ["auto", "cpu", "gpu"])]
    pub device: Option<String>,
    /// Skip the pair of a row with itself, for self-joins (--left and --right the same input);
    /// between different inputs use --options exclude_self=COLUMN.
    #[arg(long)]
    pub exclude_self: bool,
    /// The vector column of --left, when it has several.
    #[arg(long)]
    pub left_column: Option<String>,
    /// The vector column of --right, when it has several.
    #[arg(long)]
    pub right_column: Option<String>,
    /// Replace --output if it exists.
    #[arg(long, alias = "force")]
    pub overwrite: bool,
    /// Run on an Apache Ballista cluster (`sparse-knn scheduler`): df://HOST:PORT; --left and
    /// --right must be paths the executors can read.
    #[arg(long, value_name = "df://HOST:PORT")]
    pub cluster: Option<String>,
    /// With --cluster: seconds a query waits for a live executor before it fails (default 60).
    #[arg(long = "cluster-timeout", value_name = "SECS", requires = "cluster")]
    pub cluster_timeout: Option<u64>,
    /// At the end, print where the time went: the command's phases (setup, the first and last
    /// pairs, the output's writes and commit) and the join operator's metrics, as EXPLAIN
    /// ANALYZE shows them (the right side's read and build, kernel time per GPU, bytes moved).
    #[arg(long)]
    pub profile: bool,
}

impl KnnArgs {
    /// The options string handed to `knn_join`: --options, then the dedicated flags on top.
    pub fn options_string(&self) -> String {
        let mut items = vec![self.options.trim().trim_end_matches(',').to_string()];
        if let Some(d) = &self.device {
            items.push(format!("device={d}"));
        }
        if self.exclude_self {
            items.push("exclude_self=true".into());
        }
        if let Some(c) = &self.left_column {
            items.push(format!("left_column={c}"));
        }
        if let Some(c) = &self.right_column {
            items.push(format!("right_column={c}"));
        }
        items.retain(|s| !s.is_empty());
        items.join(", ")
    }
}

pub async fn run(args: KnnArgs) -> CliResult<()> {
    let setup_started = Instant::now();
    if args.k == 0 {
        cli_bail!("-k must be at least 1");
    }
    let left_at = Location::parse("--left", &args.left)?;
    let right_at = Location::parse("--right", &args.right)?;
    let output_at = Location::parse("--output", &args.output)?;
    let options_text = args.options_string();
    // Checked here too so that a typo fails before any file is read or created.
    let options = JoinOptions::default().apply(&options_text)?;
    options.metric(&args.metric)?;
    // Local inputs are counted from their footers before anything else, which also checks that
    // they exist; object-store inputs once they are registered.
    let local_rows = |at: &Location| match at {
        // An index file's rows are counted from its table once registered.
        Location::Local(path) if crate::index::is_index_path(&path.to_string_lossy()) => Ok(None),
        Location::Local(path) => parquet_rows(path).map(Some),
        Location::Remote(_) => Ok(None),
    };
    let (left_rows, right_rows) = (local_rows(&left_at)?, local_rows(&right_at)?);

    let session_options = super::SessionOptions {
        cluster_timeout: args.cluster_timeout.map(std::time::Duration::from_secs),
        ..Default::default()
    };
    let ctx = super::session_on(&session_options, args.cluster.as_deref()).await?;
    // One statement: nothing is kept for a later one, and a kept index would hold the GPUs
    // open past the output's commit (their contexts are closed beside it).
    ctx.sql("SET sparse_knn.index_cache = '0'")
        .await?
        .collect()
        .await?;
    // The same input on both sides is one table: a self-join, where rows have an identity
    // (exclude_self=true).
    let same_input = args.left == args.right;
    let right_table = if same_input { "knn_left" } else { "knn_right" };
    register_location(&ctx, "knn_left", &left_at).await?;
    if !same_input {
        register_location(&ctx, "knn_right", &right_at).await?;
    }
    let left_rows = match left_rows {
        Some(n) => n,
        None => table_rows(&ctx, "knn_left").await?,
    };
    let right_rows = match right_rows {
        Some(n) => n,
        None => table_rows(&ctx, right_table).await?,
    };
    // The DataFrame form builds the same logical node as SQL's knn_join, without quoting paths
    // or metric names into a statement.
    let left = ctx.table("knn_left").await?;
    let right = ctx.table(right_table).await?;
    let k = usize::try_from(args.k).map_err(|_| CliError(format!("-k {} is too large", args.k)))?;
    let df = crate::planner::knn_join(left, right, &args.metric, k, &options_text)?;
    // The physical plan is kept to read the operator's metrics after the run (--profile).
    let plan = df.create_physical_plan().await?;
    let mut output = Output::create(&ctx, &output_at, args.overwrite).await?;
    let setup = setup_started.elapsed();
    let start = Instant::now();
    let mut phases = Phases::default();
    // Progress counts left rows from output pairs: every left row yields min(k, candidates)
    // pairs (a NULL vector yields none, so the bar may stop short; it is an estimate).
    let candidates = right_rows.saturating_sub(u64::from(
        args.exclude_self || !options.exclude_self.is_off(),
    ));
    let per_row = args.k.min(candidates).max(1);
    let bar = progress_bar(left_rows, "knn");
    let written = async {
        let mut stream =
            datafusion::physical_plan::execute_stream(Arc::clone(&plan), ctx.task_ctx())?;
        output.start(stream.schema())?;
        let mut pairs = 0u64;
        loop {
            let waiting = Instant::now();
            let Some(batch) = stream.next().await else {
                break;
            };
            phases.waited += waiting.elapsed();
            let batch = batch?;
            phases.first_pairs.get_or_insert_with(|| start.elapsed());
            pairs += batch.num_rows() as u64;
            let writing = Instant::now();
            output.write(&batch).await?;
            phases.written += writing.elapsed();
            bar.set_position((pairs / per_row).min(left_rows));
        }
        phases.last_pairs = start.elapsed();
        Ok::<_, CliError>(pairs)
    }
    .await;
    // The operator's metrics are read now: the plan holds the join's index (and with it the
    // GPUs) until it is dropped below, beside the output's commit.
    let operator_lines = args.profile.then(|| join_metrics(plan.as_ref()));
    // Asked before the GPUs are closed below (asking opens one).
    let device = match options.device {
        DeviceChoice::Auto if crate::gpu::is_available() => "gpu",
        DeviceChoice::Auto | DeviceChoice::Cpu => "cpu",
        DeviceChoice::Gpu => "gpu",
    };
    let pairs = match written {
        Ok(pairs) => {
            log::debug!("knn: the last pairs are written");
            // The join's streams are done: its index (held by the plan) is freed and the
            // driver's teardown of the contexts runs beside the output's last row groups instead
            // of after them, at the exit.
            let closing = (device == "gpu").then(|| {
                std::thread::spawn(move || {
                    let started = std::time::Instant::now();
                    // The index's device memory is freed here, then its contexts destroyed.
                    drop(plan);
                    log::debug!("knn: the join's index freed in {:?}", started.elapsed());
                    let closed = crate::gpu::close_unused();
                    log::debug!("knn: {closed} GPU(s) closed in {:?}", started.elapsed());
                    (closed, started.elapsed())
                })
            });
            let committing = Instant::now();
            let committed = output.commit().await;
            phases.committed = committing.elapsed();
            if let Some(closing) = closing {
                phases.gpus_closed = closing.join().ok();
            }
            committed?;
            log::debug!("knn: the output is committed");
            pairs
        }
        Err(e) => {
            output.abort().await;
            return Err(e);
        }
    };
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "knn: {left_rows} left rows x {right_rows} right rows, {pairs} pairs, {secs:.2} s, {:.0} rows/s, device {device}, {} k={} -> {output_at}",
        left_rows as f64 / secs.max(1e-9),
        args.metric,
        args.k,
    );
    if args.profile {
        eprint!(
            "{}",
            phases.report(setup, secs, operator_lines.as_deref().unwrap_or_default())
        );
    }
    Ok(())
}

/// Where a `knn` job's time went, for `--profile`.
#[derive(Debug, Default)]
struct Phases {
    /// From the start of the join to its first output batch: the right side read and built,
    /// the first probe done.
    first_pairs: Option<std::time::Duration>,
    /// From the start of the join to its last output batch.
    last_pairs: std::time::Duration,
    /// Waiting on the join's stream (the rest of the loop is the output's writes).
    waited: std::time::Duration,
    /// Handing batches to the output (local files: encoded on the rayon pool, in order).
    written: std::time::Duration,
    /// The output's last row groups, its footer and its rename (or upload) into place.
    committed: std::time::Duration,
    /// How many GPUs' contexts were destroyed beside the commit, and in what time.
    gpus_closed: Option<(usize, std::time::Duration)>,
}

impl Phases {
    fn report(&self, setup: std::time::Duration, total: f64, operator_lines: &str) -> String {
        let secs = |d: std::time::Duration| d.as_secs_f64();
        let mut out = String::from("knn profile (seconds):\n");
        let mut line = |what: &str, value: String| out.push_str(&format!("  {what:<54} {value}\n"));
        line(
            "setup (session, inputs registered, plan)",
            format!("{:.3}", secs(setup)),
        );
        line(
            "first pairs (right side read and built, first probe)",
            self.first_pairs
                .map_or("none".into(), |d| format!("{:.3}", secs(d))),
        );
        line("last pairs", format!("{:.3}", secs(self.last_pairs)));
        line(
            "  of which waiting on the join",
            format!("{:.3}", secs(self.waited)),
        );
        line(
            "  of which writing the output",
            format!("{:.3}", secs(self.written)),
        );
        line(
            "output committed in",
            format!("{:.3}", secs(self.committed)),
        );
        if let Some((count, time)) = self.gpus_closed {
            line(
                &format!("{count} GPU(s) closed beside the commit, in"),
                format!("{:.3}", secs(time)),
            );
        }
        line("total (as the summary line)", format!("{total:.3}"));
        out.push_str(operator_lines);
        out
    }
}

/// The plan's join operators with their metrics, a line each, as `--profile` prints them.
fn join_metrics(plan: &dyn ExecutionPlan) -> String {
    let mut joins = Vec::new();
    collect_joins(plan, &mut joins);
    if joins.is_empty() {
        return "  (no join operator in this process: its metrics stay with the cluster's executors)\n"
            .into();
    }
    joins
        .into_iter()
        .map(|join| {
            format!(
                "  {}\n",
                DisplayableExecutionPlan::with_metrics(join).one_line()
            )
        })
        .collect()
}

/// The plan's join operators (their metrics are the join's own account of its time).
fn collect_joins<'a>(plan: &'a dyn ExecutionPlan, joins: &mut Vec<&'a dyn ExecutionPlan>) {
    if plan.name().ends_with("JoinExec") {
        joins.push(plan);
    }
    for child in plan.children() {
        collect_joins(child.as_ref(), joins);
    }
}

/// The Parquet output, local or in an object store. Either way the result appears at its name
/// only when complete: a local file is renamed into place, an S3 object is a (multipart) upload
/// that is completed at the end and aborted on failure, so a failed run leaves no partial object.
// One value per job, never moved around in bulk: boxing a writer would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Output {
    Local {
        output: OutputFile,
        file: Option<File>,
        writer: Option<ParallelParquetWriter<File>>,
    },
    Remote {
        url: Url,
        store: Arc<dyn ObjectStore>,
        path: object_store::path::Path,
        writer: Option<AsyncArrowWriter<BufWriter>>,
    },
}

impl Output {
    async fn create(ctx: &SessionContext, at: &Location, overwrite: bool) -> CliResult<Self> {
        match at {
            Location::Local(path) => {
                let (output, file) = OutputFile::create(path, overwrite)?;
                Ok(Output::Local {
                    output,
                    file: Some(file),
                    writer: None,
                })
            }
            Location::Remote(url) => {
                if url.path().ends_with('/') {
                    cli_bail!("--output {url} is a folder; --output must name an object");
                }
                let store = ctx.runtime_env().object_store(
                    datafusion::execution::object_store::ObjectStoreUrl::parse(
                        &url[..url::Position::BeforePath],
                    )?,
                )?;
                let path = Location::object_path(url)?;
                if !overwrite {
                    match store.head(&path).await {
                        Ok(_) => cli_bail!("{url} exists; pass --overwrite to replace it"),
                        Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => cli_bail!("cannot check --output {url}: {e}"),
                    }
                }
                Ok(Output::Remote {
                    url: url.clone(),
                    store,
                    path,
                    writer: None,
                })
            }
        }
    }

    fn start(&mut self, schema: SchemaRef) -> CliResult<()> {
        match self {
            Output::Local { file, writer, .. } => {
                let file = file
                    .take()
                    .ok_or_else(|| CliError("output started twice".into()))?;
                *writer = Some(ParallelParquetWriter::try_new(
                    file,
                    schema,
                    writer_properties(),
                )?);
            }
            Output::Remote {
                store,
                path,
                writer,
                ..
            } => {
                let upload = BufWriter::new(Arc::clone(store), path.clone());
                *writer = Some(AsyncArrowWriter::try_new(
                    upload,
                    schema,
                    Some(writer_properties()),
                )?);
            }
        }
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch) -> CliResult<()> {
        match self {
            Output::Local {
                writer: Some(w), ..
            } => w.write(batch)?,
            Output::Remote {
                writer: Some(w), ..
            } => w.write(batch).await?,
            _ => cli_bail!("output written before it was started"),
        }
        Ok(())
    }

    async fn commit(self) -> CliResult<()> {
        match self {
            Output::Local { output, writer, .. } => {
                let Some(writer) = writer else {
                    cli_bail!("the job produced no output schema");
                };
                writer.close()?;
                output.commit()
            }
            Output::Remote { url, writer, .. } => {
                let Some(mut writer) = writer else {
                    cli_bail!("the job produced no output schema");
                };
                if let Err(e) = writer.finish().await {
                    let _ = writer.into_inner().abort().await;
                    cli_bail!("cannot write {url}: {e}");
                }
                Ok(())
            }
        }
    }

    /// Leaves nothing behind: the local temporary file is removed when dropped, the upload is
    /// aborted.
    async fn abort(self) {
        if let Output::Remote {
            writer: Some(writer),
            ..
        } = self
        {
            let _ = writer.into_inner().abort().await;
        }
    }
}
