//! Writing the cache: a staging directory beside the output, shards streamed tensor by tensor,
//! `stats.json`, then `manifest.json` last, then one rename into place. A compile that stops
//! for any reason leaves no directory that could be taken for a cache.

use crate::error::{CompileError, Result};
use dsc_format::checksum::Hasher;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The staging directory of a compile into `out`; removed on drop unless committed.
#[derive(Debug)]
pub(crate) struct Staging {
    pub dir: PathBuf,
    out: PathBuf,
    committed: bool,
}

fn sibling(out: &Path, suffix: &str) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cache".into());
    out.with_file_name(format!(".{name}.{suffix}"))
}

fn is_empty_dir(path: &Path) -> Result<bool> {
    Ok(std::fs::read_dir(path)
        .map_err(|e| CompileError::io(path, e))?
        .next()
        .is_none())
}

impl Staging {
    /// Checks `out` (absent, an empty directory, or replaceable with `force`), removes a staging
    /// directory left by a killed compile, and creates a fresh one.
    pub fn create(out: &Path, force: bool) -> Result<Staging> {
        if out.exists() {
            if !out.is_dir() {
                return Err(CompileError::io(
                    out,
                    std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "exists and is not a directory",
                    ),
                ));
            }
            if !force && !is_empty_dir(out)? {
                return Err(CompileError::OutputExists { path: out.into() });
            }
        }
        if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| CompileError::io(parent, e))?;
        }
        let dir = sibling(out, "dsc-partial");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| CompileError::io(&dir, e))?;
        }
        std::fs::create_dir_all(dir.join(dsc_format::SHARDS_DIR))
            .map_err(|e| CompileError::io(&dir, e))?;
        Ok(Staging {
            dir,
            out: out.into(),
            committed: false,
        })
    }

    /// Writes a small file inside the staging directory through a temporary name.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let mut f = File::create(&tmp).map_err(|e| CompileError::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| CompileError::io(&tmp, e))?;
        f.sync_all().map_err(|e| CompileError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| CompileError::io(&path, e))
    }

    /// Moves the finished cache to `out`, replacing what was there.
    pub fn commit(mut self) -> Result<PathBuf> {
        let old = sibling(&self.out, "dsc-old");
        if self.out.exists() {
            if old.exists() {
                std::fs::remove_dir_all(&old).map_err(|e| CompileError::io(&old, e))?;
            }
            std::fs::rename(&self.out, &old).map_err(|e| CompileError::io(&self.out, e))?;
        }
        std::fs::rename(&self.dir, &self.out).map_err(|e| CompileError::io(&self.out, e))?;
        self.committed = true;
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| CompileError::io(&old, e))?;
        }
        Ok(self.out.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A shard file being written: bytes go through a hasher to disk.
pub(crate) struct ShardWriter {
    path: PathBuf,
    out: BufWriter<File>,
    hasher: Hasher,
    bytes: u64,
}

impl ShardWriter {
    pub fn create(path: PathBuf) -> Result<ShardWriter> {
        let file = File::create(&path).map_err(|e| CompileError::io(&path, e))?;
        Ok(ShardWriter {
            path,
            out: BufWriter::with_capacity(1 << 20, file),
            hasher: Hasher::new(),
            bytes: 0,
        })
    }

    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.hasher.update(bytes);
        self.bytes += bytes.len() as u64;
        self.out
            .write_all(bytes)
            .map_err(|e| CompileError::io(&self.path, e))
    }

    /// Flushes and returns (size, xxh3).
    pub fn finish(self) -> Result<(u64, String)> {
        let file = self
            .out
            .into_inner()
            .map_err(|e| CompileError::io(&self.path, e.into_error()))?;
        file.sync_all()
            .map_err(|e| CompileError::io(&self.path, e))?;
        Ok((self.bytes, self.hasher.hex()))
    }
}
