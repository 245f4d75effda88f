//! What a right side is, for the index cache: its plan, the files it scans as they are now (size,
//! modification time, ETag), the in-memory batches it reads, and the options that shape its
//! index. Two statements whose right sides have equal identities build equal indexes, so the
//! second may take the first's; any difference (a file rewritten or added, a table replaced, an
//! option changed) is a different identity and a rebuild.
//!
//! Files are looked up again (`head`) for every identity rather than trusted from the plan: the
//! plan's file list comes from planning, and a listing cache may be older than the file.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::Result;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Volatility;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::{displayable, ExecutionPlan};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

/// Files looked up at once when a folder's files are checked.
const HEADS_IN_FLIGHT: usize = 16;

/// One scanned file as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileStamp {
    store: String,
    location: String,
    size: u64,
    modified_ns: i64,
    e_tag: Option<String>,
    version: Option<String>,
}

/// The identity of a right side (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexKey {
    plan: String,
    build: String,
    files: Vec<FileStamp>,
    /// The addresses and lengths of the in-memory batches' buffers; the cache entry holds the
    /// batches themselves, so no other batch can take these addresses while it lives.
    memory: Vec<(usize, usize)>,
}

impl FileStamp {
    /// The file's path in its store.
    pub(crate) fn location(&self) -> &str {
        &self.location
    }

    /// The file's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The stamp as an index folder's manifest records it.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "store": self.store,
            "location": self.location,
            "size": self.size,
            "modified_ns": self.modified_ns,
            "e_tag": self.e_tag,
            "version": self.version,
        })
    }

    /// A stamp a manifest recorded; None where an entry is missing or of the wrong type.
    pub(crate) fn from_json(value: &serde_json::Value) -> Option<Self> {
        let text = |key: &str| value.get(key).and_then(serde_json::Value::as_str);
        let optional = |key: &str| match value.get(key) {
            None | Some(serde_json::Value::Null) => Some(None),
            Some(v) => v.as_str().map(|s| Some(s.to_string())),
        };
        Some(Self {
            store: text("store")?.to_string(),
            location: text("location")?.to_string(),
            size: value.get("size")?.as_u64()?,
            modified_ns: value.get("modified_ns")?.as_i64()?,
            e_tag: optional("e_tag")?,
            version: optional("version")?,
        })
    }

    /// The file as a user names it: its store's URL and its path there.
    pub(crate) fn display(&self) -> String {
        match self.store.as_str() {
            "file:///" | "file://" => format!("/{}", self.location),
            store => format!("{}/{}", store.trim_end_matches('/'), self.location),
        }
    }

    #[cfg(test)]
    pub(crate) fn for_test(location: &str, size: u64) -> Self {
        Self {
            store: "file:///".to_string(),
            location: location.to_string(),
            size,
            modified_ns: 0,
            e_tag: None,
            version: None,
        }
    }
}

impl IndexKey {
    /// The files the side scans as they are now, in row order (one scan: its files).
    pub(crate) fn files(&self) -> &[FileStamp] {
        &self.files
    }

    /// What shapes the index besides its rows.
    pub(crate) fn build(&self) -> &str {
        &self.build
    }
}

/// An identity and the in-memory batches it names (held by the cache entry).
pub(crate) struct InputIdentity {
    pub key: IndexKey,
    pub pinned: Vec<RecordBatch>,
}

/// What the plan reads, found in one walk.
#[derive(Default)]
struct Leaves {
    scans: Vec<(String, Vec<object_store::path::Path>)>,
    batches: Vec<RecordBatch>,
    cacheable: bool,
}

/// The identity of `plan` read for an index shaped by `build`; None when the plan reads
/// something whose changes cannot be seen (a stream, a volatile function, a source of unknown
/// kind) or a file that cannot be looked up: such a right side is always built.
pub(crate) async fn identify(
    plan: &Arc<dyn ExecutionPlan>,
    context: &TaskContext,
    build: String,
) -> Result<Option<InputIdentity>> {
    let mut leaves = Leaves {
        cacheable: true,
        ..Default::default()
    };
    walk(plan, &mut leaves)?;
    if !leaves.cacheable {
        return Ok(None);
    }
    let mut files = Vec::new();
    for (url, paths) in &leaves.scans {
        let store_url = datafusion::execution::object_store::ObjectStoreUrl::parse(url)?;
        let store = context.runtime_env().object_store(&store_url)?;
        let heads = futures::stream::iter(paths.iter().cloned())
            .map(|path| {
                let store = Arc::clone(&store);
                async move { store.head(&path).await }
            })
            .buffered(HEADS_IN_FLIGHT)
            .try_collect::<Vec<_>>()
            .await;
        // A file that went away: the scan says so, with its own error.
        let Ok(heads) = heads else { return Ok(None) };
        files.extend(heads.into_iter().map(|meta| {
            FileStamp {
                store: url.clone(),
                location: meta.location.to_string(),
                size: meta.size,
                modified_ns: meta
                    .last_modified
                    .timestamp_nanos_opt()
                    .unwrap_or_else(|| meta.last_modified.timestamp_micros()),
                e_tag: meta.e_tag,
                version: meta.version,
            }
        }));
    }
    let memory = leaves
        .batches
        .iter()
        .flat_map(|b| b.columns().iter())
        .flat_map(|column| buffers(&column.to_data()))
        .collect();
    Ok(Some(InputIdentity {
        key: IndexKey {
            plan: displayable(plan.as_ref()).indent(true).to_string(),
            build,
            files,
            memory,
        },
        pinned: leaves.batches,
    }))
}

fn walk(plan: &Arc<dyn ExecutionPlan>, leaves: &mut Leaves) -> Result<()> {
    plan.apply_expressions(&mut |expr| {
        expr.apply(|node| {
            let volatile = node
                .downcast_ref::<ScalarFunctionExpr>()
                .is_some_and(|f| f.fun().signature().volatility != Volatility::Immutable);
            if volatile {
                leaves.cacheable = false;
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })
    })?;
    let children = plan.children();
    if children.is_empty() {
        if let Some(scan) = plan.downcast_ref::<super::IndexScanExec>() {
            // An index file is known by its stamp like any file, an index folder by its
            // manifest's (renamed into place by every refresh; segments never change); an index
            // value in memory holds its own indexes, which a cache entry would only copy.
            match scan
                .source()
                .path()
                .map(|p| match p.is_dir() {
                    true => p.join(super::MANIFEST),
                    false => p.to_path_buf(),
                })
                .and_then(|p| std::fs::canonicalize(p).ok())
                .and_then(|p| object_store::path::Path::from_absolute_path(p).ok())
            {
                Some(path) => leaves.scans.push(("file:///".to_string(), vec![path])),
                None => leaves.cacheable = false,
            }
        } else if let Some(source) = plan.downcast_ref::<DataSourceExec>() {
            let source = source.data_source();
            if let Some(files) = source.downcast_ref::<FileScanConfig>() {
                let mut paths: Vec<_> = files
                    .file_groups
                    .iter()
                    .flat_map(|g| g.iter().map(|f| f.object_meta.location.clone()))
                    .collect();
                // A large file is scanned in byte ranges, one per partition: look it up once.
                paths.dedup();
                leaves
                    .scans
                    .push((files.object_store_url.as_str().to_string(), paths));
            } else if let Some(memory) = source.downcast_ref::<MemorySourceConfig>() {
                leaves
                    .batches
                    .extend(memory.partitions().iter().flatten().cloned());
            } else {
                leaves.cacheable = false;
            }
        } else if !(plan.downcast_ref::<EmptyExec>().is_some()
            || plan.downcast_ref::<PlaceholderRowExec>().is_some())
        {
            leaves.cacheable = false;
        }
    }
    for child in children {
        walk(child, leaves)?;
    }
    Ok(())
}

/// (address, length) of every buffer of `data` and its children.
fn buffers(data: &arrow::array::ArrayData) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = data
        .buffers()
        .iter()
        .map(|b| (b.as_ptr() as usize, b.len()))
        .collect();
    out.push((data.offset(), data.len()));
    if let Some(nulls) = data.nulls() {
        out.push((nulls.buffer().as_ptr() as usize, nulls.buffer().len()));
    }
    for child in data.child_data() {
        out.extend(buffers(child));
    }
    out
}
