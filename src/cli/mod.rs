//! The `sparse-knn` command line: one module per subcommand, shared plumbing here.
//!
//! The binary only calls [`main`]; everything is in the library so that tests and benches can
//! reuse the pieces (table registration, Parquet output, progress bars).

/// Returns early with a `CliError` built like `format!` (defined before the submodules so that
/// they see it).
macro_rules! cli_bail {
    ($($arg:tt)*) => {
        return Err($crate::cli::CliError(format!($($arg)*)))
    };
}

pub mod bench;
#[cfg(feature = "serve")]
mod bench_serve;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod generate;
pub mod index;
pub mod knn;
mod parquet_out;
#[cfg(feature = "serve")]
pub mod remote;
#[cfg(feature = "serve")]
pub mod serve;
pub mod shell;
pub mod sql;
pub mod store;

pub use store::Location;

use std::fmt;
use std::fs::File;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use datafusion::catalog::UrlTableFactory;
use datafusion::execution::context::SessionContext;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionConfig};
use indicatif::{ProgressBar, ProgressStyle};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};

/// Exact kNN and distance joins over sparse vectors, on a CUDA GPU or all CPU cores.
#[derive(Debug, Parser)]
#[command(name = "sparse-knn", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run SQL with every sparse-knn function registered.
    Sql(sql::SqlArgs),
    /// For every row of --left, its k nearest rows of --right, written to Parquet.
    Knn(knn::KnnArgs),
    /// Synthetic data shaped like the paper's datasets, written to Parquet.
    Generate(generate::GenerateArgs),
    /// Time the self knn_join per metric and device.
    Bench(bench::BenchArgs),
    /// Build an index file (.skidx): the rows and their built index, loaded by later joins
    /// instead of built again.
    Index(index::IndexArgs),
    /// Serve one shared session over Arrow Flight SQL (ADBC, JDBC, `sql --server`).
    #[cfg(feature = "serve")]
    Serve(serve::ServeArgs),
    /// Run an Apache Ballista scheduler with every sparse-knn function and operator.
    #[cfg(feature = "cluster")]
    Scheduler(cluster::SchedulerArgs),
    /// Run an Apache Ballista executor with every sparse-knn function and operator.
    #[cfg(feature = "cluster")]
    Executor(cluster::ExecutorArgs),
}

/// An error for the user: printed as one line on stderr.
#[derive(Debug)]
pub struct CliError(pub String);

impl CliError {
    /// A DataFusion error about the command line itself (a bad size, a refused address): its
    /// message without the backtrace or DataFusion's "Error during planning: " label.
    pub fn from_planning(e: datafusion::error::DataFusionError) -> Self {
        CliError(e.strip_backtrace().replace("Error during planning: ", ""))
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Errors from DataFusion can span lines (nested contexts, plans); the contract is one line.
        let mut first = true;
        for part in self.0.split_whitespace() {
            if !first {
                f.write_str(" ")?;
            }
            f.write_str(part)?;
            first = false;
        }
        Ok(())
    }
}

impl std::error::Error for CliError {}

macro_rules! from_error {
    ($($t:ty),*) => {$(
        impl From<$t> for CliError {
            fn from(e: $t) -> Self {
                CliError(e.to_string())
            }
        }
    )*};
}
from_error!(
    datafusion::error::DataFusionError,
    arrow::error::ArrowError,
    parquet::errors::ParquetError,
    std::io::Error
);

pub type CliResult<T> = std::result::Result<T, CliError>;

/// Parses the arguments, runs the subcommand and turns any error into one stderr line.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            let text = e.render().to_string();
            let line = text.lines().next().unwrap_or("invalid arguments");
            let line = line.strip_prefix("error: ").unwrap_or(line);
            eprintln!("sparse-knn: {line} (see sparse-knn --help)");
            return ExitCode::from(2);
        }
    };
    // A server says what it serves (a line per statement) unless told otherwise.
    #[cfg(feature = "serve")]
    let default_filter = if matches!(cli.command, Command::Serve(_)) {
        "warn,datafusion_sparse_knn=info"
    } else {
        "warn"
    };
    #[cfg(not(feature = "serve"))]
    let default_filter = "warn";
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_filter))
        // Milliseconds: debug logs are how a run's phases are timed.
        .format_timestamp_millis()
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sparse-knn: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Sql(args) => sql::run(args).await,
            Command::Knn(args) => knn::run(args).await,
            Command::Generate(args) => generate::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Index(args) => index::run(args).await,
            #[cfg(feature = "serve")]
            Command::Serve(args) => serve::run(args).await,
            #[cfg(feature = "cluster")]
            Command::Scheduler(args) => cluster::run_scheduler(args).await,
            #[cfg(feature = "cluster")]
            Command::Executor(args) => cluster::run_executor(args).await,
        }
    });
    // The timeline of a run (RUST_LOG=datafusion_sparse_knn=debug) ends here: what follows is
    // the teardown (0.13-0.15 s after a GPU join on an H200 or H100, most of it the process's
    // exit: an `_exit` past the runtime's shutdown saved ~0.02 s of it and was not kept; `knn`
    // destroys its GPU contexts beside its output's last writes, which leaves ~0.09 s).
    if log::log_enabled!(log::Level::Debug) {
        // The exit unmaps what is still resident: part of the teardown that follows.
        let resident = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map(|pages| format!(" ({} MiB resident)", (pages * 4096) >> 20))
            .unwrap_or_default();
        log::debug!("sparse-knn: the command returned{resident}");
    }
    drop(runtime);
    log::debug!("sparse-knn: the runtime is shut down");
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `sparse-knn sql ... | head` closes stdout early: stop quietly, but not with success
        // (the output is cut short); 141 is what a shell reports for a process killed by SIGPIPE.
        Err(e) if e.0.contains("Broken pipe") => ExitCode::from(141),
        Err(e) => {
            eprintln!("sparse-knn: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the command line sets in a session besides the defaults.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The memory pool's size in bytes (`--memory-limit`); `None`: unbounded, DataFusion's
    /// default.
    pub memory_limit: Option<u64>,
    /// With `--cluster`: how long a query waits for a live executor (`--cluster-timeout`);
    /// `None`: `cluster::DEFAULT_CLUSTER_TIMEOUT`.
    pub cluster_timeout: Option<Duration>,
}

/// A session with every sparse-knn function and setting registered.
pub fn session() -> CliResult<SessionContext> {
    session_with(&SessionOptions::default())
}

/// A session with every sparse-knn function and setting registered, S3 paths readable, and
/// `options` applied.
pub fn session_with(options: &SessionOptions) -> CliResult<SessionContext> {
    Ok(session_parts(options)?.0)
}

/// A session as [`session_with`] makes it or, with `cluster` (`df://HOST:PORT`), a client of
/// that Apache Ballista cluster with the same functions, settings and URL tables.
pub async fn session_on(
    options: &SessionOptions,
    cluster: Option<&str>,
) -> CliResult<SessionContext> {
    let (ctx, _factory) = session_parts(options)?;
    let Some(url) = cluster else { return Ok(ctx) };
    #[cfg(feature = "cluster")]
    {
        let ctx = cluster::connect(ctx, url, options.cluster_timeout).await?;
        // The URL-table factory reads files through the session it serves: the new one.
        _factory
            .inner()
            .session_store()
            .with_state(ctx.state_weak_ref());
        Ok(ctx)
    }
    #[cfg(not(feature = "cluster"))]
    cli_bail!("--cluster {url}: this sparse-knn was built without the `cluster` feature")
}

fn session_parts(options: &SessionOptions) -> CliResult<(SessionContext, Arc<store::UrlTables>)> {
    let config = SessionConfig::new()
        .with_information_schema(true)
        .with_option_extension(crate::options::SparseKnnConfig::default());
    let mut runtime = crate::runtime_env_builder()
        .with_object_store_registry(Arc::new(store::EnvObjectStores::default()));
    if let Some(bytes) = options.memory_limit {
        let bytes = usize::try_from(bytes)
            .map_err(|_| CliError(format!("--memory-limit {bytes} is too large")))?;
        runtime = runtime.with_memory_limit(bytes, 1.0);
    }
    let ctx = SessionContext::new_with_config_rt(config, runtime.build_arc()?);
    // URL tables let a query name a file directly: SELECT * FROM 'out.parquet' (or 's3://...').
    // This is `enable_url_table` with our factory, which reports why an S3 URL cannot be read.
    let factory = Arc::new(store::UrlTables::default());
    let ctx = crate::planner::with_url_tables(
        ctx,
        Arc::clone(&factory) as Arc<dyn UrlTableFactory>,
        factory.inner(),
    );
    crate::register_all(&ctx)?;
    Ok((ctx, factory))
}

/// Registers a local or object-store file or folder as table `name` (see [`register_path`]).
pub async fn register_location(
    ctx: &SessionContext,
    name: &str,
    location: &Location,
) -> CliResult<()> {
    let url = match location {
        Location::Local(path) => return register_path(ctx, name, path).await,
        Location::Remote(url) => url.to_string(),
    };
    let folder = url.ends_with('/');
    let ext = (!folder)
        .then(|| {
            let last = url.rsplit('/').next().unwrap_or_default();
            last.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())
        })
        .flatten();
    let result = match ext.as_deref() {
        Some("csv") => ctx.register_csv(name, &url, CsvReadOptions::new()).await,
        Some(e @ ("json" | "ndjson" | "jsonl")) => {
            let options = JsonReadOptions {
                file_extension: &format!(".{e}"),
                ..Default::default()
            };
            ctx.register_json(name, &url, options).await
        }
        _ if folder => {
            ctx.register_parquet(name, &url, ParquetReadOptions::default())
                .await
        }
        e => {
            let dotted = e.map(|e| format!(".{e}")).unwrap_or_default();
            let options = ParquetReadOptions {
                file_extension: &dotted,
                ..Default::default()
            };
            ctx.register_parquet(name, &url, options).await
        }
    };
    result.map_err(|e| CliError(format!("table '{name}': cannot read {url}: {e}")))
}

/// Row count of a table, from Parquet footers where DataFusion has them (no data is scanned).
pub async fn table_rows(ctx: &SessionContext, name: &str) -> CliResult<u64> {
    let rows = ctx.table(name).await?.count().await?;
    Ok(rows as u64)
}

/// Registers a Parquet file or folder (or a CSV / NDJSON file, by extension) as table `name`.
pub async fn register_path(ctx: &SessionContext, name: &str, path: &Path) -> CliResult<()> {
    if !path.exists() {
        cli_bail!("table '{name}': no such file or folder: {}", path.display());
    }
    let location = path.to_string_lossy();
    // An index folder (`NAME.skidx/`) is an index like an index file.
    let ext = if path.is_dir() && !crate::index::is_index_path(&location) {
        None
    } else {
        path.extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
    };
    match ext.as_deref() {
        Some("skidx") => {
            let table = crate::index::IndexTable::open(path)?;
            ctx.register_table(name, std::sync::Arc::new(table))?;
        }
        Some("csv") => {
            ctx.register_csv(name, location.as_ref(), CsvReadOptions::new())
                .await?
        }
        Some(e @ ("json" | "ndjson" | "jsonl")) => {
            let options = JsonReadOptions {
                file_extension: &format!(".{e}"),
                ..Default::default()
            };
            ctx.register_json(name, location.as_ref(), options).await?
        }
        Some(e) => {
            // A single file is read whatever its extension; a folder keeps the .parquet filter.
            let dotted = format!(".{e}");
            let options = ParquetReadOptions {
                file_extension: &dotted,
                ..Default::default()
            };
            ctx.register_parquet(name, location.as_ref(), options)
                .await?
        }
        None if path.is_file() => {
            let options = ParquetReadOptions {
                file_extension: "",
                ..Default::default()
            };
            ctx.register_parquet(name, location.as_ref(), options)
                .await?
        }
        None => {
            ctx.register_parquet(name, location.as_ref(), ParquetReadOptions::default())
                .await?
        }
    }
    Ok(())
}

/// The Parquet files of a path: the file itself, or the `*.parquet` files under a folder.
pub fn parquet_files(path: &Path) -> CliResult<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.is_dir() {
        cli_bail!("no such file or folder: {}", path.display());
    }
    let mut files = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let p = entry?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
            {
                files.push(p);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        cli_bail!("no .parquet files under {}", path.display());
    }
    Ok(files)
}

/// Row count of a Parquet file or folder, from the footers only.
pub fn parquet_rows(path: &Path) -> CliResult<u64> {
    let mut rows = 0u64;
    for f in parquet_files(path)? {
        let reader = SerializedFileReader::new(File::open(&f)?)
            .map_err(|e| CliError(format!("{}: {e}", f.display())))?;
        rows += reader.metadata().file_metadata().num_rows() as u64;
    }
    Ok(rows)
}

/// Writer settings of every Parquet file the CLI writes.
pub fn writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(64 * 1024))
        // Dense shapes (scrna) reach a gigabyte in 64K rows; readers want row groups they can
        // hold and split between cores.
        .set_max_row_group_bytes(Some(128 << 20))
        .build()
}

/// A file written under a temporary name next to its destination and renamed into place on
/// [`OutputFile::commit`], so a failed or interrupted run leaves no half-written output, and an
/// existing file is only replaced when the user said so.
pub struct OutputFile {
    target: PathBuf,
    temp: PathBuf,
    overwrite: bool,
    committed: bool,
}

impl OutputFile {
    pub fn create(target: &Path, overwrite: bool) -> CliResult<(Self, File)> {
        if target.exists() && !overwrite {
            cli_bail!(
                "{} exists; pass --overwrite to replace it",
                target.display()
            );
        }
        if target.is_dir() {
            cli_bail!("{} is a folder; --output must be a file", target.display());
        }
        let name = target
            .file_name()
            .ok_or_else(|| CliError(format!("--output {} is not a file name", target.display())))?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".{}.tmp", std::process::id()));
        let temp = target.with_file_name(temp_name);
        let file = File::create(&temp)
            .map_err(|e| CliError(format!("cannot write {}: {e}", temp.display())))?;
        Ok((
            Self {
                target: target.to_path_buf(),
                temp,
                overwrite,
                committed: false,
            },
            file,
        ))
    }

    pub fn commit(mut self) -> CliResult<()> {
        // Checked again: another process may have created the file while we were writing.
        if self.target.exists() && !self.overwrite {
            cli_bail!(
                "{} appeared while writing; pass --overwrite to replace it",
                self.target.display()
            );
        }
        std::fs::rename(&self.temp, &self.target).map_err(|e| {
            CliError(format!(
                "cannot move output into {}: {e}",
                self.target.display()
            ))
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// A progress bar on stderr, drawn only when stderr is a terminal (never into logs or pipes).
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let template = format!("{{spinner}} {what} [{{bar:30}}] {{human_pos}}/{{human_len}} rows, {{elapsed}} (eta {{eta}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Splits `a,b, c` into trimmed non-empty items.
pub fn split_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}
