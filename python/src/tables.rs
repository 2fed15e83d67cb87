//! Tables in memory given to `dsc.compile` (a pyarrow `Table` or `RecordBatchReader`, a pandas
//! or polars DataFrame, a `datasets.Dataset`): each arrives as an Arrow C stream in a PyCapsule
//! (the Arrow PyCapsule interface, `__arrow_c_stream__`), is read into batches that keep the
//! producer's buffers (nothing is copied), and is registered with the compiler under a name the
//! spec then gives in place of a file.

use arrow_array::ffi_stream::{FFI_ArrowArrayStream, RecordBatchStreamReader};
use arrow_array::RecordBatchReader;
use dsc_compiler::{CompileSpec, MemoryInput, MEMORY_PREFIX};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

/// Registers each `(placeholder, capsule)` and gives back `spec` with every placeholder (a rows
/// entry, `context`, a join's file) replaced by its table's name, and the registrations, which
/// keep the tables until the compile is done.
pub(crate) fn register(
    py: Python<'_>,
    mut spec: CompileSpec,
    tables: Vec<(String, Bound<'_, PyAny>)>,
) -> PyResult<(CompileSpec, Vec<MemoryInput>)> {
    let mut held = Vec::with_capacity(tables.len());
    for (placeholder, capsule) in tables {
        let role = placeholder
            .strip_prefix(MEMORY_PREFIX)
            .unwrap_or(&placeholder)
            .to_string();
        let input = import(py, &role, &capsule)?;
        let name = input.name().to_string();
        for r in &mut spec.rows {
            if *r == placeholder {
                r.clone_from(&name);
            }
        }
        if spec.context.as_deref() == Some(placeholder.as_str()) {
            spec.context = Some(name.clone());
        }
        for j in &mut spec.joins {
            if j.file == placeholder {
                j.file.clone_from(&name);
            }
        }
        held.push(input);
    }
    Ok((spec, held))
}

/// Reads the Arrow C stream in `capsule` into batches and registers them for `role`.
fn import(py: Python<'_>, role: &str, capsule: &Bound<'_, PyAny>) -> PyResult<MemoryInput> {
    let bad = |what: String| crate::errors::options_error(py, &format!("the {role} table: {what}"));
    let capsule = capsule.cast::<PyCapsule>().map_err(|_| {
        bad("expected an Arrow C stream (a PyCapsule from __arrow_c_stream__)".into())
    })?;
    let ptr = capsule
        .pointer_checked(Some(c"arrow_array_stream"))
        .map_err(|e| bad(format!("not an Arrow C stream: {e}")))?;
    // SAFETY: the capsule is named `arrow_array_stream`, so by the Arrow PyCapsule interface it
    // holds an `FFI_ArrowArrayStream`; `from_raw` moves the stream out and leaves a released
    // one behind, so the capsule's destructor does not release it a second time. The GIL is
    // held throughout, and nothing else reads the capsule meanwhile.
    let reader =
        unsafe { RecordBatchStreamReader::from_raw(ptr.cast::<FFI_ArrowArrayStream>().as_ptr()) }
            .map_err(|e| bad(format!("its stream gives no schema: {e}")))?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("reading its batches failed: {e}")))?;
    MemoryInput::register(role, schema, batches).map_err(|e| crate::errors::compile_error(py, e))
}
