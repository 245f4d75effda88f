//! Object-store paths: `s3://bucket/key` next to local paths and `file://` URLs.
//!
//! S3 goes through the `object_store` crate DataFusion already uses (its `aws` feature, plain
//! HTTP requests signed in Rust), not the AWS SDK. A bucket's store is made the first time a
//! path names it, from the standard AWS environment variables, and kept in the session's
//! object-store registry, so SQL (`FROM 's3://...'`, `knn_join('s3://...', ...)`), `--table`
//! and the `knn` job all read through the same one.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{TableProvider, UrlTableFactory};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::dynamic_file::DynamicListTableFactory;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::ObjectStore;
use url::Url;

use super::{CliError, CliResult};
use crate::planner::is_object_store_url;

/// Where a file or folder is: on this machine or in an object store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    /// An `s3://bucket/key` URL (a key ending in `/` is a folder).
    Remote(Url),
}

impl Location {
    /// Parses a command-line path; `what` names the argument in errors.
    pub fn parse(what: &str, text: &str) -> CliResult<Self> {
        let text = text.trim();
        if text.is_empty() {
            cli_bail!("{what}: empty path");
        }
        let Some((scheme, _)) = text.split_once("://") else {
            return Ok(Location::Local(PathBuf::from(text)));
        };
        let url = Url::parse(text)
            .map_err(|e| CliError(format!("{what}: '{text}' is not a valid URL: {e}")))?;
        match scheme.to_ascii_lowercase().as_str() {
            "file" => url
                .to_file_path()
                .map(Location::Local)
                .map_err(|()| CliError(format!("{what}: '{text}' is not a local file URL"))),
            "s3" | "s3a" => {
                if url.host_str().is_none_or(str::is_empty) {
                    cli_bail!("{what}: '{text}' names no bucket; write s3://BUCKET/KEY");
                }
                Ok(Location::Remote(url))
            }
            other => cli_bail!(
                "{what}: '{text}': unsupported scheme '{other}://'; use s3://BUCKET/KEY, file:// or a local path"
            ),
        }
    }

    /// The text DataFusion's listing tables take: a local path or the URL.
    pub fn as_listing_str(&self) -> String {
        match self {
            Location::Local(p) => p.to_string_lossy().into_owned(),
            Location::Remote(u) => u.to_string(),
        }
    }

    /// The object's key inside its bucket.
    pub fn object_path(url: &Url) -> CliResult<object_store::path::Path> {
        object_store::path::Path::from_url_path(url.path())
            .map_err(|e| CliError(format!("'{url}': bad object key: {e}")))
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Remote(u) => write!(f, "{u}"),
        }
    }
}

/// The session's object-store registry: DataFusion's, plus an S3 store made on first use for
/// every bucket that a path names.
#[derive(Debug, Default)]
pub struct EnvObjectStores {
    inner: DefaultObjectStoreRegistry,
}

impl ObjectStoreRegistry for EnvObjectStores {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        if let Ok(store) = self.inner.get_store(url) {
            return Ok(store);
        }
        match url.scheme() {
            "s3" | "s3a" => {
                let bucket = url.host_str().unwrap_or_default();
                let store = s3_store(bucket)?;
                // Two first uses at once may both build one; either is fine to keep.
                self.inner.register_store(url, Arc::clone(&store));
                Ok(store)
            }
            other => Err(DataFusionError::Configuration(format!(
                "no object store for '{url}': scheme '{other}://' is not supported; use s3://BUCKET/KEY, file:// or a local path"
            ))),
        }
    }
}

/// An S3 store for `bucket`, configured like the AWS CLI from `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` / `AWS_DEFAULT_REGION`,
/// `AWS_ENDPOINT_URL` / `AWS_ENDPOINT` and `AWS_ALLOW_HTTP`.
pub fn s3_store(bucket: &str) -> Result<Arc<dyn ObjectStore>> {
    if bucket.is_empty() {
        return Err(DataFusionError::Configuration(
            "an s3:// path names no bucket; write s3://BUCKET/KEY".into(),
        ));
    }
    let builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let endpoint = builder
        .get_config_value(&AmazonS3ConfigKey::Endpoint)
        .unwrap_or_default();
    let allow_http = std::env::var("AWS_ALLOW_HTTP")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes"));
    // object_store's own message for this ("URL scheme is not allowed") names neither setting.
    if endpoint.starts_with("http://") && !allow_http {
        return Err(DataFusionError::Configuration(format!(
            "the S3 endpoint {endpoint} is plain HTTP; set AWS_ALLOW_HTTP=true to allow it"
        )));
    }
    let store = builder.build().map_err(|e| {
        DataFusionError::Configuration(format!("cannot set up S3 for bucket '{bucket}': {e}"))
    })?;
    Ok(Arc::new(store))
}

/// The session's URL tables (`SELECT * FROM 's3://bucket/x.parquet'`, and `knn_join` arguments
/// given as URLs): DataFusion's, except that an object-store URL that cannot be read is an error
/// with the store's reason (credentials, bucket, endpoint) rather than "table not found", and
/// that a local index file or folder (`SELECT * FROM 'docs.skidx'`) is its stored rows.
#[derive(Debug, Default)]
pub struct UrlTables {
    inner: DynamicListTableFactory,
}

impl UrlTables {
    pub fn inner(&self) -> &DynamicListTableFactory {
        &self.inner
    }
}

#[async_trait]
impl UrlTableFactory for UrlTables {
    async fn try_new(&self, url: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if crate::index::is_index_path(url) && !is_object_store_url(url) {
            // Within a server's read roots like any path the planner reads.
            let config = crate::planner::url_table_session(&self.inner)
                .map(|state| state.config_options().as_ref().clone())
                .unwrap_or_default();
            let argument = format!("'{url}'");
            return crate::planner::path_table("FROM", &argument, url, &config).map(Some);
        }
        if names_table_function(&self.inner, url) {
            return Ok(None);
        }
        let found = self.inner.try_new(url).await?;
        if found.is_some() || !is_object_store_url(url) {
            return Ok(found);
        }
        Err(crate::planner::url_table_failure(&self.inner, url).await)
    }
}

/// Whether `name` is a table function of the factory's session: DataFusion resolves the name of
/// every FROM item before planning, `knn_join(...)` included, and a URL table's lookup of it
/// (a HEAD of `./knn_join`, its format guessed) was 3.6% of a one-row lookup's CPU profile.
fn names_table_function(factory: &DynamicListTableFactory, name: &str) -> bool {
    use datafusion::execution::context::SessionState;
    let Some(session) = factory.session_store().get_session().upgrade() else {
        return false;
    };
    let session = session.read();
    session
        .as_any()
        .downcast_ref::<SessionState>()
        .is_some_and(|state| state.table_functions().contains_key(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_local_file_urls_or_s3() {
        assert_eq!(
            Location::parse("--left", "data/x.parquet").unwrap(),
            Location::Local(PathBuf::from("data/x.parquet"))
        );
        assert_eq!(
            Location::parse("--left", "file:///tmp/x.parquet").unwrap(),
            Location::Local(PathBuf::from("/tmp/x.parquet"))
        );
        let Location::Remote(url) = Location::parse("--left", "s3://bucket/dir/").unwrap() else {
            panic!("s3 is remote");
        };
        assert_eq!((url.host_str(), url.path()), (Some("bucket"), "/dir/"));
        let e = Location::parse("--output", "gs://bucket/x").unwrap_err().0;
        assert!(
            e.contains("unsupported scheme 'gs://'") && e.contains("--output"),
            "{e}"
        );
        let e = Location::parse("--left", "s3:///x.parquet").unwrap_err().0;
        assert!(e.contains("names no bucket"), "{e}");
        assert!(Location::parse("--left", " ").is_err());
    }

    #[test]
    fn an_s3_store_needs_a_bucket() {
        let e = s3_store("").unwrap_err().to_string();
        assert!(e.contains("names no bucket"), "{e}");
    }
}
