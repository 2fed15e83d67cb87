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
    Resume(ResumeMismatch),
    /// The CUDA runtime (loaded at run time) failed.
    #[error("CUDA: {0}")]
    Cuda(crate::cuda::CudaError),
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

/// How a checkpoint's weights differ from this run's network ([`TrainError::Resume`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeMismatch {
    /// An input or target scaling is missing from the checkpoint.
    #[error(
        "{reading}: the checkpoint was trained on other input scaling (`normalise=false`, or a \
         cache compiled with other `encode`)"
    )]
    Scaling {
        /// Reading the scaling from the checkpoint (in the message, not a source: one line).
        reading: Box<TrainError>,
    },
    /// A weight of another shape: another network.
    #[error("checkpoint weight {name} has shape {saved:?}, the model {model:?}")]
    Shape {
        /// The weight.
        name: String,
        /// Its shape in the checkpoint.
        saved: Vec<i64>,
        /// Its shape in this run's network.
        model: Vec<i64>,
    },
    /// A scaling computed from the cache's statistics that differs from the checkpoint's.
    #[error(
        "the cache's statistics give {name} = {now:?}, the checkpoint was trained with \
         {then:?}: the cache was recompiled (other `encode` or inputs) since; resume on the \
         cache the run started on"
    )]
    Statistics {
        /// The scaling.
        name: String,
        /// Its values from this cache.
        now: Vec<f64>,
        /// Its values in the checkpoint.
        then: Vec<f64>,
    },
}

// By hand, not `#[from]`: the inner error is in the message, and as a source too it would be
// printed twice by a caller that prints the chain (`{:#}`).
impl From<crate::cuda::CudaError> for TrainError {
    fn from(e: crate::cuda::CudaError) -> TrainError {
        TrainError::Cuda(e)
    }
}

impl From<ResumeMismatch> for TrainError {
    fn from(m: ResumeMismatch) -> TrainError {
        TrainError::Resume(m)
    }
}

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
