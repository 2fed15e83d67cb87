//! Rust errors as `dsc.Error` subclasses (defined in `dsc/_errors.py`) that carry where the
//! problem is: `file`, `column`, `row`, `key`, `tensor`, `sample` (None where unknown).

use dsc_compiler::CompileError;
use dsc_format::spelling::{spell, OptionError, Spelling};
use dsc_format::FormatError;
use dsc_loader::LoadError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::Path;

/// Where an error happened, as Python attributes.
#[derive(Default)]
struct Place {
    /// The keyword argument at fault (an `OptionsError`'s `option`).
    option: Option<&'static str>,
    file: Option<String>,
    column: Option<String>,
    row: Option<u64>,
    key: Option<String>,
    tensor: Option<String>,
    sample: Option<usize>,
}

fn file(p: &Path) -> Option<String> {
    Some(p.display().to_string())
}

fn raise(py: Python<'_>, class: &str, message: String, place: Place) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let module = py.import("dsc._errors")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("file", place.file)?;
        kwargs.set_item("column", place.column)?;
        kwargs.set_item("row", place.row)?;
        kwargs.set_item("key", place.key)?;
        kwargs.set_item("tensor", place.tensor)?;
        kwargs.set_item("sample", place.sample)?;
        if place.option.is_some() {
            kwargs.set_item("option", place.option)?;
            // Unspelled, for a front end of its own (`OptionsError.flags`).
            kwargs.set_item("raw", &message)?;
        }
        // The libraries name options by their keys; a Python caller reads keyword arguments.
        let message = spell(&message, Spelling::Python);
        let err = module
            .getattr(class)?
            .call((message.clone(),), Some(&kwargs))?;
        Ok(PyErr::from_value(err))
    };
    // Only a broken installation lacks dsc._errors; say so rather than lose the message.
    build().unwrap_or_else(|e| {
        pyo3::exceptions::PyRuntimeError::new_err(format!("{message} (and dsc._errors: {e})"))
    })
}

/// Bad arguments: `dsc.OptionsError` (also a `ValueError`).
pub fn options_error(py: Python<'_>, message: &str) -> PyErr {
    raise(py, "OptionsError", message.to_string(), Place::default())
}

/// The keyword argument `e` names: `dsc.OptionsError` with its `option`.
pub fn option_error(py: Python<'_>, e: &OptionError) -> PyErr {
    let place = Place {
        option: Some(e.key),
        ..Place::default()
    };
    raise(py, "OptionsError", e.to_string(), place)
}

/// A compile failure: `dsc.CompileError` with the file, column, row or key it names.
pub fn compile_error(py: Python<'_>, e: CompileError) -> PyErr {
    let message = e.to_string();
    // Options that do not fit together: the caller's arguments, not the input data.
    match &e {
        CompileError::Spec(o) => return option_error(py, o),
        CompileError::Budget { .. } => {
            let place = Place {
                option: Some("max_memory"),
                ..Place::default()
            };
            return raise(py, "OptionsError", message, place);
        }
        _ => {}
    }
    let place = match &e {
        CompileError::Io { path, .. }
        | CompileError::BadParquet { path, .. }
        | CompileError::BadCsv { path, .. }
        | CompileError::KeyList { path, .. }
        | CompileError::EmptyFile { path }
        | CompileError::OutputExists { path }
        | CompileError::Partition { path, .. }
        | CompileError::CorruptWork { path, .. }
        | CompileError::InputChanged { path, .. }
        | CompileError::OutputLocked { path, .. }
        | CompileError::OutputNotWritable { path, .. } => Place {
            file: file(path),
            ..Place::default()
        },
        CompileError::NoMatch { pattern } => Place {
            file: Some(pattern.clone()),
            ..Place::default()
        },
        CompileError::MissingColumn { path, column, .. }
        | CompileError::DuplicateColumn { path, column, .. }
        | CompileError::WrongType { path, column, .. }
        | CompileError::SchemaMismatch { path, column, .. } => Place {
            file: file(path),
            column: Some(column.clone()),
            ..Place::default()
        },
        CompileError::NullKey { path, column, row }
        | CompileError::BadValue {
            path, column, row, ..
        }
        | CompileError::BadSplit {
            path, column, row, ..
        }
        | CompileError::BadText {
            path, column, row, ..
        }
        | CompileError::Incompatible {
            path, column, row, ..
        } => Place {
            file: file(path),
            column: Some(column.clone()),
            row: Some(*row),
            ..Place::default()
        },
        CompileError::DuplicateKey {
            path,
            column,
            key,
            row,
            ..
        } => Place {
            file: file(path),
            column: Some(column.clone()),
            row: Some(*row),
            key: Some(key.clone()),
            ..Place::default()
        },
        CompileError::UnmatchedRows { path, row, key, .. } => Place {
            file: file(path),
            row: Some(*row),
            key: Some(key.to_string()),
            ..Place::default()
        },
        CompileError::EmptyContexts {
            context, row, key, ..
        } => Place {
            file: file(context),
            row: Some(*row),
            key: Some(key.to_string()),
            ..Place::default()
        },
        CompileError::MissingJoinKey {
            path, row, column, ..
        } => Place {
            file: file(path),
            column: Some(column.clone()),
            row: Some(*row),
            ..Place::default()
        },
        CompileError::NoSplit {
            context,
            key,
            column,
        } => Place {
            file: file(context),
            column: Some(column.clone()),
            key: Some(key.to_string()),
            ..Place::default()
        },
        CompileError::Overflow { column, .. } => Place {
            column: Some(column.clone()),
            ..Place::default()
        },
        CompileError::Format(f) => format_place(f),
        // TooManyRows, NoTrain, Interrupted, Internal: no one place.
        _ => Place::default(),
    };
    raise(py, "CompileError", message, place)
}

fn format_place(e: &FormatError) -> Place {
    match e {
        FormatError::Io { path, .. }
        | FormatError::Json { path, .. }
        | FormatError::InvalidManifest { path, .. }
        | FormatError::UnsupportedVersion { path, .. } => Place {
            file: file(path),
            ..Place::default()
        },
        FormatError::NotACache { dir } => Place {
            file: file(dir),
            ..Place::default()
        },
        FormatError::ShardSize { shard, .. }
        | FormatError::ShardHeader { shard, .. }
        | FormatError::Checksum { shard, .. } => Place {
            file: file(shard),
            ..Place::default()
        },
        FormatError::BadValue {
            shard,
            tensor,
            sample,
            ..
        } => Place {
            file: file(shard),
            tensor: Some(tensor.clone()),
            sample: Some(*sample),
            ..Place::default()
        },
        _ => Place::default(),
    }
}

/// A loader used in a process it was not started in: `dsc.WorkerError`.
pub fn worker_error(py: Python<'_>, message: &str) -> PyErr {
    raise(py, "WorkerError", message.to_string(), Place::default())
}

/// A cache that cannot be read for a reason other than its content.
pub fn cache_io_error(py: Python<'_>, message: &str) -> PyErr {
    raise(py, "CacheError", message.to_string(), Place::default())
}

/// A cache that cannot be read: `dsc.CacheError` naming the file.
pub fn format_error(py: Python<'_>, e: FormatError) -> PyErr {
    raise(py, "CacheError", e.to_string(), format_place(&e))
}

/// A loader failure: bad options, a resume state that does not fit, or an unreadable cache.
pub fn load_error(py: Python<'_>, e: LoadError) -> PyErr {
    match e {
        LoadError::Options(m) => option_error(py, &m),
        LoadError::NoSplit { .. } | LoadError::NoShard { .. } => {
            let place = Place {
                option: Some("split"),
                ..Place::default()
            };
            raise(py, "OptionsError", e.to_string(), place)
        }
        LoadError::NoTensor { ref tensor, .. } => {
            let place = Place {
                option: Some("columns"),
                tensor: Some(tensor.clone()),
                ..Place::default()
            };
            raise(py, "OptionsError", e.to_string(), place)
        }
        LoadError::Mismatch { ref tensor, .. } => {
            let place = Place {
                tensor: Some(tensor.clone()),
                ..Place::default()
            };
            raise(py, "OptionsError", e.to_string(), place)
        }
        LoadError::State { .. } => raise(py, "StateError", e.to_string(), Place::default()),
        LoadError::Store(s) => store_error(py, s),
        LoadError::Fetch { .. } => raise(py, "CacheError", e.to_string(), Place::default()),
        LoadError::Format(f) => format_error(py, f),
        LoadError::Map { ref path, .. } | LoadError::OutOfMaps { ref path, .. } => {
            let place = Place {
                file: file(path),
                ..Place::default()
            };
            raise(py, "CacheError", e.to_string(), place)
        }
        other => raise(py, "Error", other.to_string(), Place::default()),
    }
}

/// Object storage that could not be read or written: a cache already at an upload's URL is an
/// option to give (`force=True`); anything else is the cache's.
pub fn store_error(py: Python<'_>, e: dsc_store::StoreError) -> PyErr {
    match e {
        dsc_store::StoreError::Exists { ref url } => {
            let message = format!(
                "{url}: a cache is already there (its manifest.json); replace it with force=True"
            );
            let place = Place {
                option: Some("force"),
                ..Place::default()
            };
            raise(py, "OptionsError", message, place)
        }
        other => raise(py, "CacheError", other.to_string(), Place::default()),
    }
}
