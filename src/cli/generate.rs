//! `sparse-knn generate`: synthetic data shaped like the paper's datasets, to Parquet.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use parquet::arrow::ArrowWriter;

use super::{progress_bar, writer_properties, CliResult, OutputFile};
use crate::generate::{Generator, Shape};

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// movielens, nytimes, scrna or secedgar (the paper's table 2).
    #[arg(long)]
    pub shape: String,
    /// Rows to generate (default: the paper's row count); columns and degrees keep the shape.
    #[arg(long)]
    pub rows: Option<usize>,
    /// The same seed gives the same file.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Parquet file to write (columns `id` Int64 and `vec` sparse vector).
    #[arg(long, short)]
    pub output: PathBuf,
    /// Replace --output if it exists.
    #[arg(long, alias = "force")]
    pub overwrite: bool,
}

pub async fn run(args: GenerateArgs) -> CliResult<()> {
    let shape: Shape = args.shape.parse()?;
    let generator = Generator::new(shape, args.rows, args.seed)?;
    let (output, file) = OutputFile::create(&args.output, args.overwrite)?;
    let start = Instant::now();
    let rows = generator.rows() as u64;
    // Small outputs finish before a bar would be readable.
    let bar = if rows >= 100_000 {
        progress_bar(rows, "generate")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut writer = ArrowWriter::try_new(file, Generator::schema(), Some(generated_properties()))?;
    let mut nnz = 0u64;
    // Generation is CPU-bound and runs on rayon; the async runtime has nothing else to do here.
    for batch in generator.batches() {
        nnz += sparse_nnz(&batch);
        writer.write(&batch)?;
        bar.inc(batch.num_rows() as u64);
    }
    writer.close()?;
    output.commit()?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "generate: {shape} {rows} rows x {} cols, nnz {nnz} (density {:.4}%), seed {}, {secs:.2} s -> {}",
        generator.cols(),
        100.0 * nnz as f64 / (rows as f64 * generator.cols() as f64),
        args.seed,
        args.output.display()
    );
    Ok(())
}

/// Row groups of 16K rows: a scan reads a file's row groups in parallel and no faster, so a
/// paper-size file (66K to 1M rows) is read by as many cores as a GPU machine has (the 64K-row
/// groups of other outputs left a 283K-row right side to 5 threads: 0.28 s of a 2.8 s join).
fn generated_properties() -> parquet::file::properties::WriterProperties {
    writer_properties()
        .into_builder()
        .set_max_row_group_row_count(Some(16 * 1024))
        .build()
}

/// Stored entries of the `vec` column of a generated batch.
pub fn sparse_nnz(batch: &arrow::array::RecordBatch) -> u64 {
    use arrow::array::AsArray;
    let vec = batch.column(1).as_struct();
    let indices = vec.column(0).as_list::<i32>();
    let offsets = indices.value_offsets();
    (offsets[offsets.len() - 1] - offsets[0]) as u64
}
