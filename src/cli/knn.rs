//! `sparse-knn knn`: the Parquet-to-neighbours job through the `knn_join` operator.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use futures::StreamExt;
use parquet::arrow::ArrowWriter;

use super::{
    parquet_rows, progress_bar, register_path, session, writer_properties, CliError, CliResult,
    OutputFile,
};
use crate::options::{DeviceChoice, JoinOptions};

#[derive(Debug, Args)]
pub struct KnnArgs {
    /// Query rows: a Parquet file or a folder of them.
    #[arg(long)]
    pub left: PathBuf,
    /// Rows searched: a Parquet file or a folder of them.
    #[arg(long)]
    pub right: PathBuf,
    /// Distance, e.g. cosine, euclidean, manhattan, jensenshannon (any name or alias of the SPEC).
    #[arg(long)]
    pub metric: String,
    /// Neighbours per left row.
    #[arg(short = 'k', long)]
    pub k: u64,
    /// Parquet file to write: query_*, neighbor_*, distance, rank.
    #[arg(long, short)]
    pub output: PathBuf,
    /// Join options 'key=value,...' (p, dim, device, exclude_self, left_column, right_column, ...).
    #[arg(long, default_value = "")]
    pub options: String,
    /// Where the join runs (overrides --options).
    #[arg(long, value_parser = ["auto", "cpu", "gpu"])]
    pub device: Option<String>,
    /// Skip the pair of a row with itself (same row position), for self-joins.
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
    if args.k == 0 {
        cli_bail!("-k must be at least 1");
    }
    let options_text = args.options_string();
    // Checked here too so that a typo fails before any file is read or created.
    let options = JoinOptions::default().apply(&options_text)?;
    options.metric(&args.metric)?;
    let left_rows = parquet_rows(&args.left)?;
    let right_rows = parquet_rows(&args.right)?;

    let ctx = session()?;
    register_path(&ctx, "knn_left", &args.left).await?;
    register_path(&ctx, "knn_right", &args.right).await?;
    // The DataFrame form builds the same logical node as SQL's knn_join, without quoting paths
    // or metric names into a statement.
    let left = ctx.table("knn_left").await?;
    let right = ctx.table("knn_right").await?;
    let k = usize::try_from(args.k).map_err(|_| CliError(format!("-k {} is too large", args.k)))?;
    let df = crate::planner::knn_join(left, right, &args.metric, k, &options_text)?;
    let (output, file) = OutputFile::create(&args.output, args.overwrite)?;
    let start = Instant::now();
    let mut stream = df.execute_stream().await?;
    let mut writer = ArrowWriter::try_new(file, stream.schema(), Some(writer_properties()))?;
    // Progress counts left rows from output pairs: every left row yields min(k, candidates)
    // pairs (a NULL vector yields none, so the bar may stop short; it is an estimate).
    let candidates =
        right_rows.saturating_sub(u64::from(args.exclude_self || options.exclude_self));
    let per_row = args.k.min(candidates).max(1);
    let bar = progress_bar(left_rows, "knn");
    let mut pairs = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        pairs += batch.num_rows() as u64;
        writer.write(&batch)?;
        bar.set_position((pairs / per_row).min(left_rows));
    }
    writer.close()?;
    output.commit()?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let device = match options.device {
        DeviceChoice::Auto if crate::gpu::is_available() => "gpu",
        DeviceChoice::Auto | DeviceChoice::Cpu => "cpu",
        DeviceChoice::Gpu => "gpu",
    };
    eprintln!(
        "knn: {left_rows} left rows x {right_rows} right rows, {pairs} pairs, {secs:.2} s, {:.0} rows/s, device {device}, {} k={} -> {}",
        left_rows as f64 / secs.max(1e-9),
        args.metric,
        args.k,
        args.output.display()
    );
    Ok(())
}
