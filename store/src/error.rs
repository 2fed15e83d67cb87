//! What can go wrong talking to object storage, each naming the URL it concerns.

use std::path::PathBuf;

/// Why an object could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The URL is not one dsc can read a cache from.
    #[error("{url}: {problem}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The bucket (or container) the URL names does not exist, or these credentials cannot see
    /// it.
    #[error("{url}: the bucket does not exist (or these credentials cannot see it)")]
    NoBucket {
        /// The URL given.
        url: String,
    },
    /// No credentials were found for the store: it fell back to the cloud's instance metadata
    /// service, which this machine has not.
    #[error(
        "{url}: no credentials found (looked in {looked}); give them there, or as store options"
    )]
    NoCredentials {
        /// The URL given.
        url: String,
        /// Where the store's client looked, in order.
        looked: &'static str,
    },
    /// No object at this URL.
    #[error("{url}: not found")]
    NotFound {
        /// The object's URL.
        url: String,
    },
    /// The store refused or failed the request (credentials, network, the server).
    #[error("{url}: {source}")]
    Store {
        /// The object's (or the cache's) URL.
        url: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// A signal (SIGINT, SIGTERM) stopped an upload before its manifest was published: no
    /// reader finds a cache there from it.
    #[error(
        "{url}: stopped by signal {signal} before the manifest was published: no cache is there{}; \
         the objects already sent are left (the next upload with `force=true` removes them)",
        if *replaced { " (the old one's manifest had been removed first)" } else { "" }
    )]
    Interrupted {
        /// The cache's URL.
        url: String,
        /// The signal.
        signal: i32,
        /// Whether a cache was there and its manifest removed before the upload.
        replaced: bool,
    },
    /// A signal stopped a download: nothing of the object was kept.
    #[error("{url}: stopped by signal {signal} while fetching it; nothing of it was kept")]
    Stopped {
        /// The object's URL.
        url: String,
        /// The signal.
        signal: i32,
    },
    /// An object is not the size it must be.
    #[error("{url}: {found} bytes arrived where {expected} were expected")]
    Short {
        /// The object's URL.
        url: String,
        /// Bytes expected (the manifest's size, or the range asked for).
        expected: u64,
        /// Bytes that arrived.
        found: u64,
    },
    /// A download's checksum is not the manifest's: the object changed since the manifest was
    /// read (a cache replaced under a reader) or was damaged. The download was not kept.
    #[error(
        "{url}: xxh3 {found} where the manifest says {expected}: the object was replaced or \
         damaged since the manifest was read; nothing was kept"
    )]
    Checksum {
        /// The object's URL.
        url: String,
        /// The manifest's checksum.
        expected: String,
        /// The downloaded bytes' checksum.
        found: String,
    },
    /// A cache is already at the URL and replacing it was not asked for.
    #[error("{url}: a cache is already there (its manifest.json); replace it with `force=true`")]
    Exists {
        /// The cache's URL.
        url: String,
    },
    /// A local file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The local file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The runtime that drives requests could not be started.
    #[error("cannot start the object storage runtime: {0}")]
    Runtime(std::io::Error),
}

impl StoreError {
    /// `e`, a store's error about `url`: absent objects as [`StoreError::NotFound`].
    pub(crate) fn from_store(url: String, e: object_store::Error) -> StoreError {
        // A store says "no such bucket" only in its error's text (S3's NoSuchBucket, Azure's
        // ContainerNotFound, Google's message), and a missing object's 404 not at all.
        const NO_BUCKET: [&str; 3] = [
            "NoSuchBucket",
            "ContainerNotFound",
            "The specified bucket does not exist",
        ];
        // Without credentials in the environment or the configuration files, each client
        // asks the instance metadata service; off a cloud machine that request fails, and its
        // error names an internal address rather than what is missing.
        const METADATA: [&str; 2] = ["169.254.169.254", "metadata.google.internal"];
        match e {
            object_store::Error::NotFound { .. } => StoreError::NotFound { url },
            source if NO_BUCKET.iter().any(|m| source.to_string().contains(m)) => {
                StoreError::NoBucket { url }
            }
            source if METADATA.iter().any(|m| source.to_string().contains(m)) => {
                let looked = match url.split_once("://").map(|(s, _)| s) {
                    Some("gs") => {
                        "GOOGLE_APPLICATION_CREDENTIALS and GOOGLE_SERVICE_ACCOUNT, the gcloud \
                         application default credentials file, the instance metadata service"
                    }
                    Some("az" | "adl" | "azure" | "abfs" | "abfss") => {
                        "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY, AZURE_CLIENT_ID with \
                         its secret, the instance metadata service"
                    }
                    _ => {
                        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE in \
                         ~/.aws/credentials and ~/.aws/config, AWS_WEB_IDENTITY_TOKEN_FILE, the \
                         instance metadata service"
                    }
                };
                StoreError::NoCredentials { url, looked }
            }
            source => StoreError::Store { url, source },
        }
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }

    /// The message without the URL it starts with: for callers that name the object
    /// themselves (an I/O error of a reader, wrapped with the path it reads).
    pub fn problem(&self) -> String {
        let text = self.to_string();
        let url = match self {
            StoreError::Url { url, .. }
            | StoreError::NotFound { url }
            | StoreError::NoCredentials { url, .. }
            | StoreError::NoBucket { url }
            | StoreError::Store { url, .. }
            | StoreError::Short { url, .. }
            | StoreError::Checksum { url, .. }
            | StoreError::Exists { url }
            | StoreError::Stopped { url, .. }
            | StoreError::Interrupted { url, .. } => url,
            StoreError::Io { .. } | StoreError::Runtime(_) => return text,
        };
        text.strip_prefix(&format!("{url}: "))
            .map_or(text.clone(), str::to_string)
    }

    /// Whether trying again can help: a transfer that failed on the way, not an absent object,
    /// a bad URL or a local file.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Store { .. } | StoreError::Short { .. } | StoreError::Checksum { .. }
        )
    }
}
