//! `sparse-knn index`: an index file (`.skidx`) of a right side, which later joins load instead
//! of reading and indexing the source again.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::{register_location, CliResult, Location};
use crate::index::SparseIndex;

#[derive(Debug, Args)]
pub struct IndexArgs {
    /// The rows to index: a Parquet file or a folder of them (local, file:// or s3://BUCKET/KEY).
    #[arg(long)]
    pub input: String,
    /// The index file to write; its name ends in .skidx, which is how joins recognise it.
    #[arg(long, short)]
    pub output: PathBuf,
    /// A metric the index serves (repeat, or separate with commas). A join with another metric
    /// is an error that lists these.
    #[arg(long = "metric", value_delimiter = ',', default_value = "cosine")]
    pub metrics: Vec<String>,
    /// Options 'key=value,...' that shape the index: p (minkowski), dim, right_column.
    #[arg(long, default_value = "")]
    pub options: String,
    /// The vector column, when the input has several (same as --options right_column=...).
    #[arg(long)]
    pub column: Option<String>,
    /// Replace --output if it exists.
    #[arg(long, alias = "force")]
    pub overwrite: bool,
}

pub async fn run(args: IndexArgs) -> CliResult<()> {
    let started = Instant::now();
    if !crate::index::is_index_path(&args.output.to_string_lossy()) {
        cli_bail!(
            "--output '{}': an index file's name ends in .skidx (joins recognise it by that)",
            args.output.display()
        );
    }
    if args.output.exists() && !args.overwrite {
        cli_bail!(
            "--output '{}' exists; pass --overwrite to replace it",
            args.output.display()
        );
    }
    let input = Location::parse("--input", &args.input)?;
    let mut options = args.options.trim().trim_end_matches(',').to_string();
    if let Some(c) = &args.column {
        if !options.is_empty() {
            options.push_str(", ");
        }
        options.push_str(&format!("right_column={c}"));
    }
    // The file holds CPU indexes (a GPU join builds its own from the stored rows): built here
    // on the CPU whatever the session's device.
    if !options.is_empty() {
        options.push_str(", ");
    }
    options.push_str("device=cpu");
    let metrics: Vec<&str> = args.metrics.iter().map(String::as_str).collect();
    let ctx = super::session()?;
    register_location(&ctx, "index_input", &input).await?;
    let frame = ctx.table("index_input").await?;
    eprintln!(
        "index: reading {} and indexing it for {}",
        args.input,
        metrics.join(", ")
    );
    let index = SparseIndex::build(frame, &metrics, &options).await?;
    let built = started.elapsed();
    let bytes = index.save(&args.output)?;
    eprintln!(
        "index: {} rows, {} metric(s), {:.1} MB written to {} in {:.2} s (read and built in {:.2} s)",
        index.rows(),
        index.metrics().len(),
        bytes as f64 / 1e6,
        args.output.display(),
        started.elapsed().as_secs_f64(),
        built.as_secs_f64()
    );
    Ok(())
}
