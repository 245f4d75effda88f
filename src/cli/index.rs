//! `sparse-knn index`: an index file (`.skidx`) of a right side, which later joins load instead
//! of reading and indexing the source again; over a folder, an index folder of segments
//! (`index/folder.rs`) that a second run over the grown folder refreshes with the new files alone.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use clap::Args;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use super::{register_location, CliResult, Location};
use crate::index::{
    plan_runs, remove_unused, segment_name, FileStamp, Manifest, Run, SegmentEntry, SparseIndex,
    WriterLock, MANIFEST,
};

#[derive(Debug, Args)]
pub struct IndexArgs {
    /// The rows to index: a Parquet file or a folder of them (local, file:// or s3://BUCKET/KEY).
    #[arg(long)]
    pub input: String,
    /// The index file to write; its name ends in .skidx, which is how joins recognise it.
    #[arg(long, short)]
    pub output: PathBuf,
    /// A metric the index serves (repeat, or separate with commas; default cosine, or those of
    /// the index folder being refreshed). A join with another metric is an error that lists these.
    #[arg(long = "metric", value_delimiter = ',')]
    pub metrics: Vec<String>,
    /// Options 'key=value,...' that shape the index: p (minkowski), dim, right_column (default:
    /// none, or those of the index folder being refreshed).
    #[arg(long, default_value = "")]
    pub options: String,
    /// The vector column, when the input has several (same as --options right_column=...).
    #[arg(long)]
    pub column: Option<String>,
    /// Replace --output if it exists (an index folder: every file read and built again).
    #[arg(long, alias = "force")]
    pub overwrite: bool,
    /// An index folder whose files were rewritten or removed since it was built: build the
    /// segments that held them again (without it, such a change is an error naming the files).
    #[arg(long)]
    pub refresh: bool,
}

pub async fn run(args: IndexArgs) -> CliResult<()> {
    let started = Instant::now();
    if !crate::index::is_index_path(&args.output.to_string_lossy()) {
        cli_bail!(
            "--output '{}': an index file's name ends in .skidx (joins recognise it by that)",
            args.output.display()
        );
    }
    let input = Location::parse("--input", &args.input)?;
    let folder_input = match &input {
        Location::Local(path) => path.is_dir(),
        Location::Remote(url) => url.path().ends_with('/'),
    };
    if folder_input {
        return index_folder(&args, &input, started).await;
    }
    if args.refresh {
        cli_bail!(
            "--refresh refreshes an index folder (the index of a folder of files); --input '{}' \
             is one file",
            args.input
        );
    }
    if args.output.is_dir() {
        cli_bail!(
            "--output '{}' is a folder; the index of one file is a file: choose another name",
            args.output.display()
        );
    }
    if args.output.exists() && !args.overwrite {
        cli_bail!(
            "--output '{}' exists; pass --overwrite to replace it",
            args.output.display()
        );
    }
    let options = shaping_options(&args);
    let metrics = match args.metrics.is_empty() {
        true => vec!["cosine".to_string()],
        false => args.metrics.clone(),
    };
    let metrics: Vec<&str> = metrics.iter().map(String::as_str).collect();
    let ctx = super::session()?;
    register_location(&ctx, "index_input", &input).await?;
    let frame = ctx.table("index_input").await?;
    eprintln!(
        "index: reading {} and indexing it for {}",
        args.input,
        metrics.join(", ")
    );
    let join_options = crate::options::session_options(ctx.copied_config().options())?
        .apply(&on_the_cpu(&options))?;
    let plan = frame.create_physical_plan().await?;
    let schema = plan.schema();
    let batches = rows_in_file_order(&ctx, plan).await?;
    let index = SparseIndex::from_batches(schema, batches, &metrics, &join_options)?;
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

/// `plan`'s rows in the files' order, as a join's build reads a right side: its partitions one
/// after the other, no partition taking another's files (ties go to the earlier row, and a
/// stored index must break them as its source does).
async fn rows_in_file_order(
    ctx: &SessionContext,
    plan: Arc<dyn ExecutionPlan>,
) -> datafusion::common::Result<Vec<RecordBatch>> {
    let context = crate::planner::in_file_order(&ctx.task_ctx());
    datafusion::physical_plan::collect(crate::planner::gather(plan), context).await
}

/// The options that shape the index, as the user gave them (`--options`, `--column`).
fn shaping_options(args: &IndexArgs) -> String {
    let mut options = args.options.trim().trim_end_matches(',').to_string();
    if let Some(c) = &args.column {
        if !options.is_empty() {
            options.push_str(", ");
        }
        options.push_str(&format!("right_column={c}"));
    }
    options
}

/// `options` building on the CPU: the file holds CPU indexes (a GPU join builds its own from the
/// stored rows), built here whatever the session's device.
fn on_the_cpu(options: &str) -> String {
    match options.is_empty() {
        true => "device=cpu".to_string(),
        false => format!("{options}, device=cpu"),
    }
}

/// `index` over a folder: an index folder of segments. A first run builds one segment of every
/// file; a run over the grown folder keeps the segments whose files are unchanged and builds the
/// rest (the new files, those of segments with a rewritten or removed file under `--refresh`,
/// and neighbours merged by size), then writes the new manifest in one rename.
async fn index_folder(args: &IndexArgs, input: &Location, started: Instant) -> CliResult<()> {
    let output = args.output.as_path();
    if output.is_file() {
        cli_bail!(
            "--output '{}' is an index file; the index of a folder is a folder of segments: \
             choose another name, or remove the file",
            output.display()
        );
    }
    std::fs::create_dir_all(output).map_err(|e| {
        super::CliError(format!(
            "--output '{}': creating the folder: {e}",
            output.display()
        ))
    })?;
    let _lock = WriterLock::take(output)?;
    let previous = Manifest::read(output)?;
    if previous.is_none() && !crate::index::holds_only_index_files(output) {
        cli_bail!(
            "--output '{}' is a folder that is not an index folder (no {MANIFEST}): choose \
             another name",
            output.display()
        );
    }
    let kept_from = previous.as_ref().filter(|_| !args.overwrite);
    let given_options = shaping_options(args);
    let (metrics, options) = match kept_from {
        Some(manifest) => {
            let metrics = match args.metrics.is_empty() {
                true => manifest.metrics.clone(),
                false => args.metrics.clone(),
            };
            let options = match given_options.is_empty() {
                true => manifest.options.clone(),
                false => given_options,
            };
            if metrics != manifest.metrics || options != manifest.options {
                cli_bail!(
                    "index folder '{}' was built for {} with options '{}', not for {} with '{}': \
                     refresh it with the same (or none), or pass --overwrite to build it again",
                    output.display(),
                    manifest.metrics.join(", "),
                    manifest.options,
                    metrics.join(", "),
                    options
                );
            }
            (metrics, options)
        }
        None => {
            let metrics = match args.metrics.is_empty() {
                true => vec!["cosine".to_string()],
                false => args.metrics.clone(),
            };
            (metrics, given_options)
        }
    };
    let metric_names: Vec<&str> = metrics.iter().map(String::as_str).collect();

    let ctx = super::session()?;
    register_location(&ctx, "index_input", input).await?;
    let frame = ctx.table("index_input").await?;
    let plan = frame.create_physical_plan().await?;
    let Some(scanned) = crate::planner::scan_files(&plan) else {
        cli_bail!(
            "--input '{}': not read as files one after the other; index it into an index file \
             (--output NAME.skidx over one file)",
            args.input
        );
    };
    let identity = crate::index::identify(&plan, &ctx.task_ctx(), String::new()).await?;
    let stamps: Vec<FileStamp> = identity
        .map(|i| i.key.files().to_vec())
        .filter(|stamps| stamps.len() == scanned.len())
        .ok_or_else(|| {
            super::CliError(format!(
                "--input '{}': its files changed while they were listed; run again",
                args.input
            ))
        })?;
    if stamps.is_empty() {
        cli_bail!("--input '{}' holds no file to index", args.input);
    }
    let previous_segments = kept_from.map_or(&[][..], |m| &m.segments[..]);
    let changed = crate::index::changed_sources(previous_segments, &stamps);
    if !changed.is_empty() && !args.refresh {
        let shown: Vec<String> = changed
            .iter()
            .take(10)
            .map(|(file, what)| format!("{file} ({what})"))
            .collect();
        let more = match changed.len() > 10 {
            true => format!(" and {} more", changed.len() - 10),
            false => String::new(),
        };
        cli_bail!(
            "index folder '{}': files it was built from changed since: {}{more}; pass --refresh \
             to build their segments again (or --overwrite to build everything)",
            output.display(),
            shown.join(", ")
        );
    }
    let runs = plan_runs(previous_segments, &stamps);
    let to_build: Vec<Range<usize>> = runs
        .iter()
        .filter_map(|r| match r {
            Run::Build(files) => Some(files.clone()),
            Run::Kept(..) => None,
        })
        .collect();
    if let (true, Some(manifest)) = (to_build.is_empty(), kept_from) {
        // What dead writers left goes; a reader that read an older manifest than this one and
        // finds its segment gone reads the manifest again.
        remove_unused(output, manifest, None);
        eprintln!(
            "index: '{}' is up to date: {} rows of {} files in {} segments",
            output.display(),
            manifest.rows(),
            stamps.len(),
            manifest.segments.len()
        );
        return Ok(());
    }
    eprintln!(
        "index: {} files of {} to read and index for {} ({} segments kept)",
        to_build.iter().map(Range::len).sum::<usize>(),
        stamps.len(),
        metric_names.join(", "),
        runs.len() - to_build.len()
    );

    let generation = previous.as_ref().map_or(0, |m| m.generation) + 1;
    let join_options = crate::options::session_options(ctx.copied_config().options())?
        .apply(&on_the_cpu(&options))?;
    let config = ctx.copied_config();
    let (partitions, min_range) = (
        config.target_partitions(),
        config.options().optimizer.repartition_file_min_size,
    );
    let mut segments = Vec::with_capacity(runs.len());
    let mut built = 0;
    for run in &runs {
        let files = run.files();
        if let Run::Kept(i, _) = run {
            segments.push(previous_segments[*i].clone());
            continue;
        }
        let run_started = Instant::now();
        let segment_plan = crate::planner::plan_of_files(
            &plan,
            scanned[files.clone()].to_vec(),
            partitions,
            min_range,
        )?;
        let batches = rows_in_file_order(&ctx, segment_plan).await?;
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let file = match rows {
            0 => None,
            _ => {
                let name = segment_name(generation, built);
                let index = SparseIndex::from_batches(
                    plan.schema(),
                    batches,
                    &metric_names,
                    &join_options,
                )?;
                index.save(output.join(&name))?;
                Some(name)
            }
        };
        built += 1;
        eprintln!(
            "index: segment {built} of {}: {} files, {rows} rows, read, built and written in {:.2} s",
            to_build.len(),
            files.len(),
            run_started.elapsed().as_secs_f64()
        );
        segments.push(SegmentEntry {
            file,
            rows,
            sources: stamps[files].to_vec(),
        });
    }
    let manifest = Manifest {
        generation,
        input: args.input.clone(),
        metrics,
        options,
        segments,
    };
    manifest.write(output)?;
    remove_unused(output, &manifest, previous.as_ref());
    eprintln!(
        "index: {} rows of {} files in {} segments ({} built) written to {} in {:.2} s",
        manifest.rows(),
        stamps.len(),
        manifest.segments.len(),
        built,
        output.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
