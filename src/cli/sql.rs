//! `sparse-knn sql`: run statements from -c, files or standard input and print query results;
//! with none of these on a terminal, the interactive shell of [`super::shell`].

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use clap::{Args, ValueEnum};
use datafusion::execution::context::SessionContext;
use datafusion::sql::parser::DFParser;
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use futures::StreamExt;

use super::{register_location, CliError, CliResult, Location, SessionOptions};
use crate::options::parse_bytes;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned text table.
    Table,
    /// CSV with a header line per query (nested values as text).
    Csv,
    /// One JSON object per row (newline-delimited JSON).
    Json,
}

#[derive(Debug, Args)]
pub struct SqlArgs {
    /// SQL to run (several statements separated by ';'); before any FILE.
    #[arg(short = 'c', long = "command")]
    pub command: Vec<String>,
    /// Files of SQL statements, run in order; with no -c and no file, standard input is read.
    pub files: Vec<PathBuf>,
    /// Register a Parquet file or folder (or a .csv / .json file) as a table: NAME=PATH, where
    /// PATH is local, file:// or s3://BUCKET/KEY (a folder's key ends with '/').
    #[arg(long = "table", value_name = "NAME=PATH")]
    pub tables: Vec<String>,
    /// How query results are printed.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Size of the memory pool that queries account their buffers in, e.g. 512M, 2G, 8GiB
    /// (default: unbounded). Same as SET datafusion.runtime.memory_limit.
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// Run on an Apache Ballista cluster (`sparse-knn scheduler`): df://HOST:PORT. Tables and
    /// paths must be files the executors can read.
    #[arg(long, value_name = "df://HOST:PORT")]
    pub cluster: Option<String>,
    /// With --cluster: seconds a query waits for a live executor before it fails (default 60).
    #[arg(long = "cluster-timeout", value_name = "SECS", requires = "cluster")]
    pub cluster_timeout: Option<u64>,
    /// After each statement, print its wall time (planning to last row) on stderr:
    /// `-- statement N: 0.0123 s, R rows`.
    #[arg(long)]
    pub timing: bool,
    /// Run the statements on a `sparse-knn serve` server: grpc://HOST:PORT, or
    /// grpc+tls://HOST:PORT with --tls-ca.
    #[cfg(feature = "serve")]
    #[arg(long, value_name = "grpc://HOST:PORT", conflicts_with_all = ["cluster", "tables", "memory_limit"])]
    pub server: Option<String>,
    /// With --server: a file holding the bearer token (else the variable SPARSE_KNN_TOKEN).
    #[cfg(feature = "serve")]
    #[arg(long, value_name = "FILE", requires = "server")]
    pub token_file: Option<PathBuf>,
    /// With --server grpc+tls://: the CA certificate (PEM) that signed the server's.
    #[cfg(feature = "serve")]
    #[arg(long, value_name = "FILE", requires = "server")]
    pub tls_ca: Option<PathBuf>,
}

/// The SQL of `-c` and the files, each with where it came from.
fn given_sources(args: &SqlArgs) -> CliResult<Vec<(String, String)>> {
    let mut sources: Vec<(String, String)> = args
        .command
        .iter()
        .map(|c| ("-c".to_string(), c.clone()))
        .collect();
    for f in &args.files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| CliError(format!("cannot read {}: {e}", f.display())))?;
        sources.push((f.display().to_string(), text));
    }
    Ok(sources)
}

fn standard_input() -> CliResult<(String, String)> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| CliError(format!("cannot read standard input: {e}")))?;
    Ok(("<stdin>".to_string(), text))
}

/// An error of the statements from `label`, said with where they came from.
fn in_source(label: &str, e: CliError) -> CliError {
    if label == "-c" {
        e
    } else {
        CliError(format!("{label}: {}", e.0))
    }
}

pub async fn run(args: SqlArgs) -> CliResult<()> {
    let memory_limit = args
        .memory_limit
        .as_deref()
        .map(|s| parse_bytes("--memory-limit", s))
        .transpose()
        .map_err(CliError::from_planning)?;
    #[cfg(feature = "serve")]
    if let Some(url) = &args.server {
        return run_remote(url, &args).await;
    }
    let options = SessionOptions {
        memory_limit,
        cluster_timeout: args.cluster_timeout.map(std::time::Duration::from_secs),
    };
    let ctx = super::session_on(&options, args.cluster.as_deref()).await?;
    for spec in &args.tables {
        let Some((name, path)) = spec.split_once('=') else {
            cli_bail!("--table '{spec}' is not of the form NAME=PATH");
        };
        let location = Location::parse(&format!("--table {}", name.trim()), path)?;
        register_location(&ctx, name.trim(), &location).await?;
    }
    let mut sources = given_sources(&args)?;
    if sources.is_empty() && std::io::stdin().is_terminal() {
        return super::shell::run(ctx, args.format).await;
    }
    if sources.is_empty() {
        sources.push(standard_input()?);
    }
    let mut printer = Printer::new(args.format);
    printer.timing = args.timing;
    for (label, text) in &sources {
        run_script(&ctx, text, &mut printer)
            .await
            .map_err(|e| in_source(label, e))?;
    }
    Ok(())
}

/// `sparse-knn sql --server URL`: the statements of -c, the files or standard input, run by a
/// server.
#[cfg(feature = "serve")]
async fn run_remote(url: &str, args: &SqlArgs) -> CliResult<()> {
    let token = super::serve::read_token(args.token_file.as_deref())?;
    let mut remote = super::remote::Remote::connect(
        url,
        token.text().map(str::to_string),
        args.tls_ca.as_deref(),
    )
    .await?;
    let mut sources = given_sources(args)?;
    if sources.is_empty() {
        if std::io::stdin().is_terminal() {
            cli_bail!("--server {url}: give the statements with -c, files or standard input (the shell runs locally only)");
        }
        sources.push(standard_input()?);
    }
    let mut printer = Printer::new(args.format);
    printer.timing = args.timing;
    for (label, text) in &sources {
        super::remote::run_script(&mut remote, text, &mut printer)
            .await
            .map_err(|e| in_source(label, e))?;
    }
    Ok(())
}

/// Runs every statement of `text` in order, printing the results of those that return rows.
/// Returns the number of rows printed, or `None` when no statement was a query.
pub async fn run_script(
    ctx: &SessionContext,
    text: &str,
    printer: &mut Printer,
) -> CliResult<Option<u64>> {
    let dialect_name = ctx
        .state()
        .config()
        .options()
        .sql_parser
        .dialect
        .to_string();
    // The dialect is not `Send`: parsed in a block so that it is gone before the first await
    // (the shell runs statements on spawned tasks).
    let statements = {
        let dialect = dialect_from_str(&dialect_name)
            .ok_or_else(|| CliError(format!("unsupported SQL dialect '{dialect_name}'")))?;
        DFParser::parse_sql_with_dialect(text, dialect.as_ref())?
    };
    let mut printed: Option<u64> = None;
    for statement in statements {
        let started = std::time::Instant::now();
        // Planned one at a time against the current state, so a CREATE or SET is seen by the
        // statements after it.
        let plan = ctx.state().statement_to_plan(statement).await?;
        let df = ctx.execute_logical_plan(plan).await?;
        let logical = started.elapsed();
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let task = Arc::new(df.task_ctx());
        let physical = df.create_physical_plan().await?;
        let planned = started.elapsed();
        let mut stream = datafusion::physical_plan::execute_stream(physical, task)?;
        let mut batches = Vec::new();
        let mut rows = 0u64;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            rows += batch.num_rows() as u64;
            // Table output needs every row to align the columns; the others stream.
            if printer.format == Format::Table {
                batches.push(batch);
            } else {
                printer.write(&batch)?;
            }
        }
        // Where a statement's time went: SQL to an optimized logical plan, to a physical plan
        // (the physical optimizer), and running it.
        log::debug!(
            "sql: a statement ran in {:?} ({rows} rows): logical plan {logical:?}, physical \
             plan {:?}, run {:?}",
            started.elapsed(),
            planned - logical,
            started.elapsed() - planned
        );
        printer.statement_done(started, rows);
        if !schema.fields().is_empty() {
            printer.finish_query(&schema, &batches)?;
            printed = Some(printed.unwrap_or(0) + rows);
        }
    }
    Ok(printed)
}

/// Prints query results to standard output in one format.
pub struct Printer {
    format: Format,
    header_written: bool,
    /// Print each statement's wall time on stderr (`--timing`).
    pub timing: bool,
    statements: u64,
}

impl Printer {
    pub fn new(format: Format) -> Self {
        Self {
            format,
            header_written: false,
            timing: false,
            statements: 0,
        }
    }

    /// With `--timing`, says on stderr that a statement started at `started` returned `rows`.
    pub fn statement_done(&mut self, started: std::time::Instant, rows: u64) {
        if self.timing {
            self.statements += 1;
            eprintln!(
                "-- statement {}: {:.4} s, {rows} rows",
                self.statements,
                started.elapsed().as_secs_f64()
            );
        }
    }

    /// Prints one whole result.
    pub fn print_all(&mut self, schema: &SchemaRef, batches: &[RecordBatch]) -> CliResult<()> {
        if self.format != Format::Table {
            for batch in batches {
                self.write(batch)?;
            }
        }
        self.finish_query(schema, batches)
    }

    fn write(&mut self, batch: &RecordBatch) -> CliResult<()> {
        let mut out = std::io::stdout().lock();
        match self.format {
            Format::Table => unreachable!("tables are printed whole"),
            Format::Csv => {
                let batch = nested_as_text(batch)?;
                let mut w = arrow::csv::WriterBuilder::new()
                    .with_header(!self.header_written)
                    .build(&mut out);
                if batch.num_rows() > 0 || !self.header_written {
                    w.write(&batch)?;
                    self.header_written = true;
                }
            }
            Format::Json => {
                let mut w = arrow::json::LineDelimitedWriter::new(&mut out);
                w.write(batch)?;
                w.finish()?;
            }
        }
        out.flush()?;
        Ok(())
    }

    fn finish_query(&mut self, schema: &SchemaRef, batches: &[RecordBatch]) -> CliResult<()> {
        let mut out = std::io::stdout().lock();
        match self.format {
            Format::Table => {
                let table = arrow::util::pretty::pretty_format_batches_with_schema(
                    schema.clone(),
                    batches,
                )?;
                writeln!(out, "{table}")?;
            }
            Format::Csv => {
                if !self.header_written {
                    // A query with no rows still says which columns it has.
                    let names: Vec<&str> =
                        schema.fields().iter().map(|f| f.name().as_str()).collect();
                    writeln!(out, "{}", names.join(","))?;
                }
            }
            Format::Json => {}
        }
        out.flush()?;
        self.header_written = false;
        Ok(())
    }
}

/// CSV cannot hold lists or structs: such columns are printed as Arrow displays them.
fn nested_as_text(batch: &RecordBatch) -> CliResult<RecordBatch> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| f.data_type().is_nested())
    {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default();
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if field.data_type().is_nested() {
            let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
            let text: StringArray = (0..column.len())
                .map(|i| (!column.is_null(i)).then(|| formatter.value(i).to_string()))
                .collect();
            fields.push(Field::new(field.name(), DataType::Utf8, true));
            columns.push(Arc::new(text));
        } else {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
        }
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}
