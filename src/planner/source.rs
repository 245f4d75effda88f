//! Inputs given as a path: a Parquet file or a folder of them, read as a listing table, or an
//! index file (`.skidx`), read as its index's table.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::config::{ConfigOptions, TableParquetOptions};
use datafusion::common::{plan_err, Result};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// The table `name` of `schema`, looked up from SQL planning, which is not async. Most schemas
/// answer at once; the URL tables' schema reads every file's footer of a folder. Polled to the end
/// here, outside tokio's cooperative budget: inside a task whose budget is spent (a folder of more
/// than ~120 files read its footers while the CLI's statement was planned), tokio's I/O futures
/// return Pending and wake themselves at once, forever, under a blocking poll that never yields
/// to the scheduler to renew the budget.
pub(crate) fn catalog_table(
    schema: &dyn datafusion::catalog::SchemaProvider,
    name: &str,
) -> Option<std::sync::Arc<dyn datafusion::catalog::TableProvider>> {
    futures::executor::block_on(tokio::task::unconstrained(schema.table(name)))
        .ok()
        .flatten()
}

/// Runs an object store's I/O to completion from SQL planning, which is not async. The store's
/// HTTP client runs on the tokio runtime, so the thread must leave it (`block_in_place`) rather
/// than block one of its workers; a current-thread runtime cannot do that, so there it is an
/// error rather than a hang.
pub(crate) fn block_on_io<T>(
    what: &str,
    future: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| handle.block_on(future))
        }
        _ => plan_err!(
            "reading '{what}' while planning needs a multi-threaded tokio runtime; register it as a table first"
        ),
    }
}

/// `ctx` with URL tables (`SELECT * FROM 'x.parquet'`) answered by `factory`, a wrapper of
/// DataFusion's factory `inner`: `SessionContext::enable_url_table` with a factory of our own
/// (one that says why a path cannot be read), `inner` pointed at the new session.
pub fn with_url_tables(
    ctx: datafusion::prelude::SessionContext,
    factory: Arc<dyn datafusion::catalog::UrlTableFactory>,
    inner: &datafusion::datasource::dynamic_file::DynamicListTableFactory,
) -> datafusion::prelude::SessionContext {
    let session_id = ctx.session_id();
    let catalogs = Arc::new(datafusion::catalog::DynamicFileCatalog::new(
        Arc::clone(ctx.state().catalog_list()),
        factory,
    ));
    let ctx: datafusion::prelude::SessionContext = ctx
        .into_state_builder()
        .with_session_id(session_id)
        .with_catalog_list(catalogs)
        .build()
        .into();
    inner.session_store().with_state(ctx.state_weak_ref());
    ctx
}

/// The session a URL-table factory serves, while it lives.
pub fn url_table_session(
    factory: &datafusion::datasource::dynamic_file::DynamicListTableFactory,
) -> Option<datafusion::execution::context::SessionState> {
    use datafusion::execution::context::SessionState;
    factory
        .session_store()
        .get_session()
        .upgrade()
        .and_then(|s| s.read().as_any().downcast_ref::<SessionState>().cloned())
}

/// Why DataFusion's URL-table factory found no table at `url`, which it does not say: the same
/// steps taken again (parse, find the files and their format, read a schema) give the reason: a
/// file the store refused, credentials, a missing folder.
pub async fn url_table_failure(
    factory: &datafusion::datasource::dynamic_file::DynamicListTableFactory,
    url: &str,
) -> datafusion::common::DataFusionError {
    use datafusion::common::plan_datafusion_err;
    use datafusion::datasource::listing::ListingTableConfigExt;
    let Some(state) = url_table_session(factory) else {
        return plan_datafusion_err!("'{url}': the session is gone");
    };
    let why = match ListingTableUrl::parse(url) {
        Err(e) => e,
        Ok(table_url) => match ListingTableConfig::new(table_url)
            .infer_options(&state)
            .await
        {
            Err(e) => e,
            Ok(config) => match config.infer_schema(&state).await {
                Err(e) => e,
                Ok(_) => plan_datafusion_err!("no Parquet, CSV or JSON files found"),
            },
        },
    };
    plan_datafusion_err!("cannot read '{url}': {}", why.strip_backtrace())
}

/// Whether `text` is an object-store URL (a scheme other than `file://`). The planner and the CLI
/// both ask; the CLI resolves such URLs into object stores, the planner only recognises them.
pub fn is_object_store_url(text: &str) -> bool {
    text.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && !scheme.eq_ignore_ascii_case("file")
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// Whether `text` looks like a path rather than a table name.
pub fn looks_like_path(text: &str) -> bool {
    text.contains('/')
        || text.contains('\\')
        || text.to_ascii_lowercase().ends_with(".parquet")
        || crate::index::is_index_path(text)
        || Path::new(text).exists()
}

/// The first Parquet file of a file or folder (folders are read recursively, in name order).
fn first_parquet_file(path: &Path) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path.to_path_buf());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    entries
        .iter()
        .find(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
        })
        .cloned()
        .or_else(|| {
            entries
                .iter()
                .filter(|p| p.is_dir())
                .find_map(|p| first_parquet_file(p))
        })
}

/// A table over a local index file (whose index the join then probes instead of building one),
/// or over a local Parquet file or folder.
pub fn path_table(
    function: &str,
    argument: &str,
    path: &str,
    config: &ConfigOptions,
) -> Result<Arc<dyn TableProvider>> {
    if let Some(roots) = crate::confine::ReadRoots::of(config) {
        if is_object_store_url(path) {
            return plan_err!(
                "{function}: {argument}: '{path}': this server reads local files only"
            );
        }
        let local = path.strip_prefix("file://").unwrap_or(path);
        if let Err(why) = roots.check(Path::new(local)) {
            return plan_err!("{function}: {argument}: {why}");
        }
    }
    if crate::index::is_index_path(path) && !is_object_store_url(path) {
        let local = path.strip_prefix("file://").unwrap_or(path);
        let table = crate::index::IndexTable::open(Path::new(local))
            .map_err(|e| e.context(format!("{function}: {argument}")))?;
        return Ok(Arc::new(table));
    }
    parquet_table(function, argument, path, config)
}

/// A table over a local Parquet file or folder. The schema is read from the first file's footer
/// here, synchronously, because SQL planning is not async.
fn parquet_table(
    function: &str,
    argument: &str,
    path: &str,
    config: &ConfigOptions,
) -> Result<Arc<dyn TableProvider>> {
    if is_object_store_url(path) {
        return plan_err!(
            "{function}: {argument}: '{path}' is an object-store URL; this session reads those only through the relation planner (register_all) with URL tables enabled"
        );
    }
    // `file:///abs/x.parquet` is the local path after the scheme.
    let path = path.strip_prefix("file://").unwrap_or(path);
    let local = Path::new(path);
    if !local.exists() {
        return plan_err!(
            "{function}: {argument}: '{path}' is neither a registered table nor an existing Parquet \
             file or folder (relative paths start at {})",
            std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| "?".into())
        );
    }
    let Some(file) = first_parquet_file(local) else {
        return plan_err!("{function}: {argument}: folder '{path}' holds no .parquet file");
    };
    let schema = File::open(&file)
        .map_err(|e| e.to_string())
        .and_then(|f| ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| e.to_string()))
        .map(|b| b.schema().clone());
    let schema = match schema {
        Ok(s) => s,
        Err(e) => {
            return plan_err!(
                "{function}: {argument}: cannot read '{}' as Parquet: {e}",
                file.display()
            )
        }
    };
    let format = ParquetFormat::default().with_options(TableParquetOptions {
        global: config.execution.parquet.clone(),
        ..Default::default()
    });
    let mut options = ListingOptions::new(Arc::new(format));
    options = if local.is_dir() {
        options.with_file_extension(".parquet")
    } else {
        options.with_file_extension("")
    };
    let url = ListingTableUrl::parse(path)?;
    let table = ListingTable::try_new(
        ListingTableConfig::new(url)
            .with_listing_options(options)
            .with_schema(Arc::new(strip_metadata(&schema))),
    )?;
    Ok(Arc::new(table))
}

/// Parquet footers carry the writer's Arrow schema as metadata; it is not part of the data.
fn strip_metadata(schema: &arrow::datatypes::Schema) -> arrow::datatypes::Schema {
    arrow::datatypes::Schema::new(schema.fields().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_store_urls_are_told_from_paths() {
        assert!(is_object_store_url("s3://b/k.parquet"));
        assert!(is_object_store_url("S3://b/"));
        assert!(!is_object_store_url("file:///tmp/x.parquet"));
        assert!(!is_object_store_url("data/x.parquet"));
        assert!(!is_object_store_url("my table"));
        assert!(!is_object_store_url("a b://c"));
    }
}
