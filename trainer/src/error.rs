//! Why a run could not start or stopped. Each variant names its place: the option (by its key,
//! which `dsc-train` spells as a flag), the cache, the checkpoint or the file.

use dsc_format::spelling::OptionError;
use dsc_format::FormatError;
use dsc_loader::LoadError;
use std::path::PathBuf;

/// An error of the training library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// An option no run can use, or one this cache or machine cannot serve: which, and why.
    #[error(transparent)]
    Config(#[from] OptionError),
    /// The loader refused its options or could not read the cache.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The cache's manifest or statistics could not be read.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The cache does not hold what the run needs (its targets, classes, steps, statistics).
    #[error("{}: {what}", cache.display())]
    Cache {
        /// The cache.
        cache: PathBuf,
        /// What it lacks, and what to do.
        what: String,
    },
    /// A checkpoint that cannot be read, written or resumed from.
    #[error("{}: {what}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A checkpoint's weights do not fit this run: another network, or other input scaling.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// The CUDA runtime (loaded at run time) failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// Capturing or replaying the step as a CUDA graph failed (`--graph`).
    #[error("CUDA graph (--graph; run without it to train eagerly): {0}")]
    Graph(String),
    /// libtorch refused an operation.
    #[error("{what}: {source}")]
    Torch {
        /// What the run was doing.
        what: String,
        /// libtorch's error.
        #[source]
        source: tch::TchError,
    },
    /// A file or folder could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with [`TrainError`].
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

impl TrainError {
    /// What the cache at `cache` lacks.
    pub(crate) fn cache(cache: impl Into<PathBuf>, what: impl Into<String>) -> TrainError {
        TrainError::Cache {
            cache: cache.into(),
            what: what.into(),
        }
    }

    /// What is wrong with the checkpoint at `path`.
    pub(crate) fn checkpoint(path: impl Into<PathBuf>, what: impl ToString) -> TrainError {
        TrainError::Checkpoint {
            path: path.into(),
            what: what.to_string(),
        }
    }

    /// `source` from the file or folder at `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> TrainError {
        TrainError::Io {
            path: path.into(),
            source,
        }
    }
}

impl From<String> for TrainError {
    /// The CUDA runtime's errors are strings (see `cuda`).
    fn from(e: String) -> TrainError {
        TrainError::Cuda(e)
    }
}
