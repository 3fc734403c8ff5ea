//! Where a table lives: a local directory, or a prefix of a bucket on S3-compatible
//! object storage (`s3://bucket/path`).
//!
//! Both are reached through the table's object store (delta-rs's, rooted at the table):
//! the data files are listed, checked and deleted through it, and the log is written
//! through it with delta-rs's put-if-absent — on S3, a PUT with `If-None-Match: *`
//! (conditional put by ETag, which AWS S3, MinIO, Cloudflare R2 and SeaweedFS enforce),
//! so that two writers of one table version cannot both succeed: the loser reads the
//! winner's commit and retries at the next version. No lock table (DynamoDB) is used.
//!
//! An S3 client is configured from the environment, as the AWS tools are:
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`), `AWS_REGION`
//! (default `us-east-1`), `AWS_ENDPOINT_URL` for a server other than AWS (path-style
//! requests; plain HTTP is allowed when the endpoint is an `http://` address, or with
//! `AWS_ALLOW_HTTP=true`).
//!
//! The data files of a table on S3 are written in a local staging directory first and
//! uploaded when their epoch is prepared; a local table's are written in its directory.

use super::error::DeltaError;
use deltalake::logstore::object_store::aws::AmazonS3Builder;
use deltalake::logstore::object_store::path::Path as StorePath;
use deltalake::logstore::{
    LogStore, LogStoreFactory, ObjectStoreFactory, ObjectStoreRef, StorageConfig, default_logstore,
    logstore_factories, object_store_factories,
};
use deltalake::{DeltaResult, DeltaTableError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use url::Url;

/// A table's location, parsed.
#[derive(Debug, Clone)]
pub(super) enum Location {
    /// A local directory (absolute when it exists or could be made so).
    Local(PathBuf),
    /// `s3://bucket/path`, without a trailing slash.
    S3(Url),
}

impl Location {
    /// Parses `text`: `s3://bucket/path`, or a local directory path.
    pub fn parse(text: &str) -> Result<Location, DeltaError> {
        let Some((scheme, _)) = text.split_once("://") else {
            return Ok(Location::Local(PathBuf::from(text)));
        };
        if !scheme.eq_ignore_ascii_case("s3") && !scheme.eq_ignore_ascii_case("s3a") {
            return Err(DeltaError::Location(text.to_string()));
        }
        let mut url = Url::parse(text).map_err(|_| DeltaError::Location(text.to_string()))?;
        if url.host_str().is_none_or(str::is_empty) {
            return Err(DeltaError::Location(text.to_string()));
        }
        let path = url.path().trim_end_matches('/').to_string();
        url.set_path(&path);
        Ok(Location::S3(url))
    }

    /// The location as a checkpoint records it: a local table's absolute path, an S3
    /// table's URL.
    pub fn record(&self) -> String {
        match self {
            Location::Local(dir) => std::fs::canonicalize(dir)
                .or_else(|_| std::path::absolute(dir))
                .map_or_else(|_| dir.display().to_string(), |p| p.display().to_string()),
            Location::S3(url) => url.to_string(),
        }
    }

    /// The table's URL for delta-rs to write to (a local directory is created if
    /// missing).
    pub fn url(&self, label: &str) -> Result<Url, DeltaError> {
        self.url_for(label, true)
    }

    /// The table's URL for delta-rs to read (nothing is created).
    pub fn read_url(&self, label: &str) -> Result<Url, DeltaError> {
        self.url_for(label, false)
    }

    fn url_for(&self, label: &str, create: bool) -> Result<Url, DeltaError> {
        match self {
            Location::Local(dir) => {
                let Some(text) = dir.to_str() else {
                    return Err(DeltaError::Location(label.to_string()));
                };
                let url = match create {
                    true => deltalake::ensure_table_uri(text),
                    false => deltalake::table::builder::parse_table_uri(text),
                };
                url.map_err(|source| DeltaError::Table {
                    table: label.to_string(),
                    action: "open the directory",
                    source: Box::new(source),
                })
            }
            Location::S3(url) => {
                register_s3();
                Ok(url.clone())
            }
        }
    }

    /// Where the data files are written before their epoch is prepared: a local table's
    /// directory, or for an S3 table a staging directory of job `app_id` (emptied: what
    /// a stopped run left there was never uploaded, or was uploaded already).
    pub fn staging(&self, app_id: &str) -> Result<PathBuf, DeltaError> {
        match self {
            Location::Local(dir) => Ok(dir.clone()),
            Location::S3(url) => {
                let name: String = format!("{}-{}", url.host_str().unwrap_or(""), app_id)
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                let dir = std::env::temp_dir().join(format!("sessionizer-delta-{name}"));
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_error("empty the staging directory", &dir, e)),
                }
                std::fs::create_dir_all(&dir)
                    .map_err(|e| io_error("create the staging directory", &dir, e))?;
                Ok(dir)
            }
        }
    }

    /// Whether data files are uploaded from the staging directory.
    pub fn is_remote(&self) -> bool {
        matches!(self, Location::S3(_))
    }
}

fn io_error(action: &'static str, path: &Path, source: std::io::Error) -> DeltaError {
    DeltaError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Makes `s3://` (and `s3a://`) locations known to delta-rs, once per process.
fn register_s3() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for scheme in ["s3://", "s3a://"] {
            let url = Url::parse(scheme).expect("a scheme URL");
            object_store_factories().insert(url.clone(), Arc::new(S3Stores));
            logstore_factories().insert(url, Arc::new(S3Logs));
        }
    });
}

/// Builds the S3 client of a table (see the module's documentation).
struct S3Stores;

impl ObjectStoreFactory for S3Stores {
    fn parse_url_opts(
        &self,
        url: &Url,
        config: &StorageConfig,
    ) -> DeltaResult<(ObjectStoreRef, StorePath)> {
        let mut builder = AmazonS3Builder::from_env().with_url(url.as_str());
        for (key, value) in &config.raw {
            if let Ok(key) = key.to_ascii_lowercase().parse() {
                builder = builder.with_config(key, value);
            }
        }
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .or_else(|_| std::env::var("AWS_ENDPOINT"))
            .unwrap_or_default();
        if endpoint.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            builder = builder.with_region("us-east-1");
        }
        let store = builder.build().map_err(DeltaTableError::from)?;
        let path = StorePath::from_url_path(url.path())
            .map_err(|e| DeltaTableError::Generic(format!("the table path {}: {e}", url.path())))?;
        Ok((Arc::new(store), path))
    }
}

/// The log of a table on S3: delta-rs's default log store, which commits a version with
/// a put-if-absent of its log file.
struct S3Logs;

impl LogStoreFactory for S3Logs {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> DeltaResult<Arc<dyn LogStore>> {
        Ok(default_logstore(
            prefixed_store,
            root_store,
            location,
            options,
        ))
    }
}
