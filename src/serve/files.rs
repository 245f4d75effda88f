//! What a served session reads: local files under its roots, through a `file://` store that
//! checks every location, and URL tables that say why a path is refused.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::catalog::{TableProvider, UrlTableFactory};
use datafusion::common::{plan_err, Result};
use datafusion::datasource::dynamic_file::DynamicListTableFactory;
use futures::stream::{BoxStream, StreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

use crate::confine::ReadRoots;
use crate::planner::is_object_store_url;

/// The local file system, below the roots only: every operation resolves its location
/// (symbolic links included) and is refused outside them, so a listing of a folder under a root
/// that holds a link leading out fails on that file rather than reading it.
#[derive(Debug)]
pub struct ConfinedFileStore {
    inner: LocalFileSystem,
    roots: ReadRoots,
}

impl ConfinedFileStore {
    pub fn new(roots: ReadRoots) -> Self {
        Self {
            inner: LocalFileSystem::new(),
            roots,
        }
    }

    fn allow(&self, location: &ObjectPath) -> object_store::Result<()> {
        permitted(&self.roots, location)
    }
}

/// Whether `location` lies under `roots`, as the store's own error when it does not.
fn permitted(roots: &ReadRoots, location: &ObjectPath) -> object_store::Result<()> {
    let path = filesystem_path(location);
    roots
        .check(&path)
        .map(|_| ())
        .map_err(|why| object_store::Error::PermissionDenied {
            path: path.display().to_string(),
            source: why.into(),
        })
}

/// Where `LocalFileSystem` (with no prefix) puts a location: `/` and the location's parts.
fn filesystem_path(location: &ObjectPath) -> PathBuf {
    url::Url::parse("file:///")
        .and_then(|base| base.join(location.as_ref()))
        .ok()
        .and_then(|url| url.to_file_path().ok())
        .unwrap_or_else(|| PathBuf::from("/").join(location.as_ref()))
}

impl fmt::Display for ConfinedFileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfinedFileStore({:?})", self.roots.roots())
    }
}

#[async_trait]
impl ObjectStore for ConfinedFileStore {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.allow(location)?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.allow(location)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.allow(location)?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &ObjectPath,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.allow(location)?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        let roots = self.roots.clone();
        let checked = locations
            .map(move |location| {
                let location = location?;
                permitted(&roots, &location).map(|()| location)
            })
            .boxed();
        self.inner.delete_stream(checked)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let root = ObjectPath::default();
        if let Err(e) = self.allow(prefix.unwrap_or(&root)) {
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        let roots = self.roots.clone();
        self.inner
            .list(prefix)
            .map(move |meta| {
                let meta = meta?;
                permitted(&roots, &meta.location).map(|()| meta)
            })
            .boxed()
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.allow(prefix.unwrap_or(&ObjectPath::default()))?;
        let listed = self.inner.list_with_delimiter(prefix).await?;
        for meta in &listed.objects {
            self.allow(&meta.location)?;
        }
        Ok(listed)
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.allow(from)?;
        self.allow(to)?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.allow(from)?;
        self.allow(to)?;
        self.inner.rename_opts(from, to, options).await
    }
}

/// URL tables (`SELECT * FROM 'docs/part0.parquet'`) of local paths under the roots; any other
/// is refused with the reason (DataFusion's own factory would only say the table is unknown).
#[derive(Debug)]
pub struct ConfinedUrlTables {
    inner: DynamicListTableFactory,
    roots: ReadRoots,
}

impl ConfinedUrlTables {
    pub fn new(inner: DynamicListTableFactory, roots: ReadRoots) -> Self {
        Self { inner, roots }
    }

    pub fn inner(&self) -> &DynamicListTableFactory {
        &self.inner
    }
}

#[async_trait]
impl UrlTableFactory for ConfinedUrlTables {
    async fn try_new(&self, url: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if is_object_store_url(url) {
            return plan_err!("'{url}': this server reads local files only");
        }
        let local = url.strip_prefix("file://").unwrap_or(url);
        // A name that is no path at all (an unknown table) is left to the catalog's error; so is
        // a bare name outside the roots that happens to name a file or folder of the working
        // folder (`CREATE EXTERNAL TABLE docs` asks whether a table `docs` exists first).
        let bare = !local.contains(['/', '\\']) && !url.starts_with("file://");
        if !crate::planner::looks_like_path(local) {
            return Ok(None);
        }
        if let Err(why) = self.roots.check(std::path::Path::new(local)) {
            return if bare { Ok(None) } else { plan_err!("{why}") };
        }
        if crate::index::is_index_path(local) && std::path::Path::new(local).exists() {
            // An index file or folder: its stored rows (checked under the roots above; an index
            // folder's segments are names inside it).
            let table = crate::index::IndexTable::open(std::path::Path::new(local))?;
            return Ok(Some(Arc::new(table)));
        }
        match self.inner.try_new(url).await? {
            Some(table) => Ok(Some(table)),
            None if bare => Ok(None),
            // Under a root but unreadable: a link inside that leads out, a missing file.
            None => Err(crate::planner::url_table_failure(&self.inner, url).await),
        }
    }
}
