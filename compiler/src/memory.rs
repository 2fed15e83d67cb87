//! Tables held in memory (a pyarrow `Table`, a pandas or polars DataFrame, a Hugging Face
//! `datasets.Dataset`, handed over through the Arrow C stream interface): registered under a
//! name that a spec gives where it would give a file (`memory:rows:3f2a…`), and read batch by
//! batch as a Parquet file's row groups are, never written to disk. The batches are the
//! producer's own buffers: nothing is copied to hold them.
//!
//! The name ends with the table's content hash: the xxh3-64 of its batches written as one Arrow
//! IPC stream, which is also its `xxh3` among the manifest's inputs (its `bytes` that stream's
//! length). The same batches give the same name, hash and cache; the same rows cut into other
//! batches hash differently (the cache is the same).

use crate::error::{CompileError, Result};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What names of in-memory tables begin with.
pub const MEMORY_PREFIX: &str = "memory:";

/// The rows a reader takes at once, as the Parquet reader's batches: a table given as one
/// batch (a DataFrame) is read in slices of this many rows, by several threads.
const SLICE_ROWS: usize = 64 * 1024;

/// An in-memory table as the compile reads it.
#[derive(Debug)]
pub(crate) struct MemoryTable {
    pub schema: SchemaRef,
    /// Its batches, each at most [`SLICE_ROWS`] rows (slices of the producer's).
    pub batches: Vec<RecordBatch>,
    pub rows: u64,
    /// The Arrow IPC stream of its batches: length and xxh3-64.
    pub bytes: u64,
    pub xxh3: String,
}

/// Registered tables by name, with how many registrations hold each.
type Registry = HashMap<String, (Arc<MemoryTable>, usize)>;
static TABLES: Mutex<Option<Registry>> = Mutex::new(None);

/// A table registered for compiles in this process, until dropped.
#[derive(Debug)]
pub struct MemoryInput {
    name: String,
}

impl MemoryInput {
    /// Registers the batches of a table (`schema`, `batches`) as an input for the `role` it
    /// plays (`rows`, `context`, `join`): its name is what a spec gives for it.
    pub fn register(
        role: &str,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<MemoryInput> {
        let (bytes, xxh3) = ipc_hash(&schema, &batches)?;
        let mut sliced = Vec::new();
        for b in batches {
            let mut at = 0;
            while at < b.num_rows() {
                let n = SLICE_ROWS.min(b.num_rows() - at);
                sliced.push(b.slice(at, n));
                at += n;
            }
        }
        let rows = sliced.iter().map(|b| b.num_rows() as u64).sum();
        let name = format!("{MEMORY_PREFIX}{role}:{xxh3}");
        let table = MemoryTable {
            schema,
            batches: sliced,
            rows,
            bytes,
            xxh3,
        };
        let mut all = TABLES.lock().expect("no panic holds it");
        let entry = all
            .get_or_insert_with(HashMap::new)
            .entry(name.clone())
            .or_insert_with(|| (Arc::new(table), 0));
        entry.1 += 1;
        Ok(MemoryInput { name })
    }

    /// The name a spec gives for the table.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for MemoryInput {
    fn drop(&mut self) {
        let mut all = TABLES.lock().expect("no panic holds it");
        if let Some(map) = all.as_mut() {
            if let Some(entry) = map.get_mut(&self.name) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    map.remove(&self.name);
                }
            }
        }
    }
}

/// Whether `path` names an in-memory table (registered or not).
pub(crate) fn is_memory(path: &Path) -> bool {
    path.to_str().is_some_and(|p| p.starts_with(MEMORY_PREFIX))
}

/// The registered table `path` names; an error naming it when none is (a spec written by an
/// earlier process, or a compile on another machine).
pub(crate) fn get(path: &Path) -> Result<Arc<MemoryTable>> {
    let all = TABLES.lock().expect("no panic holds it");
    all.as_ref()
        .and_then(|m| m.get(path.to_str()?))
        .map(|(t, _)| t.clone())
        .ok_or_else(|| {
            CompileError::io(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such table in memory: a table in memory is an input of the compile \
                     that was given it, in that process (dsc.compile(table, …)); write it to \
                     Parquet to compile it elsewhere",
                ),
            )
        })
}

/// Length and xxh3-64 of the batches written as one Arrow IPC stream.
fn ipc_hash(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<(u64, String)> {
    struct Hashing(dsc_format::checksum::Hasher, u64);
    impl std::io::Write for Hashing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.update(buf);
            self.1 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let fail = |e: arrow_schema::ArrowError| CompileError::BadParquet {
        path: "memory".into(),
        reason: format!("the table cannot be read as Arrow: {e}"),
        source: None,
    };
    let mut w = arrow_ipc::writer::StreamWriter::try_new(
        Hashing(dsc_format::checksum::Hasher::new(), 0),
        schema,
    )
    .map_err(fail)?;
    for b in batches {
        w.write(b).map_err(fail)?;
    }
    w.finish().map_err(fail)?;
    let Hashing(h, n) = w.into_inner().map_err(fail)?;
    Ok((n, h.hex()))
}
