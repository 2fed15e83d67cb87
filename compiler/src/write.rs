//! Writing the cache: a staging directory beside the output, shards streamed tensor by tensor,
//! `stats.json`, then `manifest.json` last, then one rename into place. A compile that stops
//! for any reason leaves no directory that could be taken for a cache.

use crate::error::{CompileError, Result};
use crate::phases::Split;
use crate::replaced::Replaced;
use dsc_format::checksum::Hasher;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// [`dsc_format::failpoint::at`]: how the tests kill or pause a compile at a chosen step.
pub(crate) fn failpoint(point: &str) {
    dsc_format::failpoint::at(point);
}

/// The staging directory of a compile into `out`; removed on drop unless committed.
#[derive(Debug)]
pub(crate) struct Staging {
    pub dir: PathBuf,
    /// How the shards are stored once committed (converted just before the commit).
    pub storage: crate::codec::Storage,
    out: PathBuf,
    committed: bool,
    /// Released after `Drop` has removed an uncommitted staging directory.
    _lock: OutputLock,
}

pub(crate) fn sibling(out: &Path, suffix: &str) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cache".into());
    out.with_file_name(format!(".{name}.{suffix}"))
}

/// An error writing beside `--out`: a refusal of the file system (permissions, a read-only
/// mount, an immutable folder) says so and what dsc was doing; anything else stays an I/O error.
fn output_err(path: &Path, action: &'static str, e: std::io::Error) -> CompileError {
    let refused = matches!(
        e.kind(),
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
    ) || e.raw_os_error() == Some(libc::EPERM);
    if refused {
        CompileError::OutputNotWritable {
            path: path.into(),
            action,
            source: e,
        }
    } else {
        CompileError::io(path, e)
    }
}

fn is_empty_dir(path: &Path) -> Result<bool> {
    Ok(std::fs::read_dir(path)
        .map_err(|e| CompileError::io(path, e))?
        .next()
        .is_none())
}

/// An exclusive lock on an output directory, held for a whole compile: a second compile into
/// the same `--out` stops at once with a message naming the holder, instead of sharing (and
/// deleting) its staging directory. An OS file lock, so it is released however the process
/// ends, killed included. The lock file `.NAME.dsc-lock` stays beside the output: removing it
/// would let a waiting process and a new one each lock a different file.
#[derive(Debug)]
pub(crate) struct OutputLock {
    _file: File,
}

impl OutputLock {
    /// The lock file of `out`, opened (created if absent).
    fn open(out: &Path) -> Result<(PathBuf, File)> {
        let path = sibling(out, "dsc-lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| output_err(&path, "create the output's lock file", e))?;
        Ok((path, file))
    }

    /// The lock taken: the holder's pid written into it for whoever waits.
    fn held(path: PathBuf, mut file: File) -> Result<OutputLock> {
        file.set_len(0).map_err(|e| CompileError::io(&path, e))?;
        write!(file, "pid {}", std::process::id()).map_err(|e| CompileError::io(&path, e))?;
        Ok(OutputLock { _file: file })
    }

    /// The lock of the cache at `out`, waiting while another dsc holds it (an append that
    /// starts while another one commits then appends on top of the generation it made).
    pub fn wait(out: &Path, waiting: impl FnOnce(&str)) -> Result<OutputLock> {
        let (path, file) = Self::open(out)?;
        if let Err(std::fs::TryLockError::WouldBlock) = file.try_lock() {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            waiting(holder.trim());
            file.lock().map_err(|e| CompileError::io(&path, e))?;
        }
        Self::held(path, file)
    }

    pub fn acquire(out: &Path) -> Result<OutputLock> {
        let (path, file) = Self::open(out)?;
        match file.try_lock() {
            Ok(()) => Self::held(path, file),
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "a process that just started".into());
                Err(CompileError::OutputLocked {
                    path: out.into(),
                    holder,
                })
            }
            Err(std::fs::TryLockError::Error(e)) => Err(CompileError::io(&path, e)),
        }
    }
}

impl Staging {
    /// Locks `out`, checks it (absent, an empty directory, or replaceable with `force`), removes
    /// a staging directory left by a killed compile, and creates a fresh one.
    pub fn create(out: &Path, force: bool) -> Result<Staging> {
        if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| output_err(parent, "create the output's folder", e))?;
        }
        // Before anything is checked or removed: what follows is this process's alone.
        let lock = OutputLock::acquire(out)?;
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
        let dir = sibling(out, dsc_format::STAGING_SUFFIX);
        let fixed = [dir.clone(), sibling(out, dsc_format::REPLACED_SUFFIX)];
        for left in fixed.into_iter().chain(crate::replaced::abandoned(out)) {
            if left.exists() {
                std::fs::remove_dir_all(&left).map_err(|e| {
                    output_err(&left, "remove what an earlier compile left beside `out`", e)
                })?;
            }
        }
        std::fs::create_dir_all(dir.join(dsc_format::SHARDS_DIR))
            .map_err(|e| output_err(&dir, "create the staging directory", e))?;
        Ok(Staging {
            dir,
            storage: crate::codec::Storage::Hot,
            out: out.into(),
            committed: false,
            _lock: lock,
        })
    }

    /// The staging folder of generation `number` of the cache at `cache`, whose lock `lock`
    /// holds: `generations/.{NNNNN}.dsc-partial`, renamed to its folder at the commit. What a
    /// killed append left there is removed first: no manifest names it, as `number` is the one
    /// after the last committed.
    pub fn generation(cache: &Path, number: u32, lock: OutputLock) -> Result<Staging> {
        let root = cache.join(dsc_format::GENERATIONS_DIR);
        let dir = root.join(format!(".{number:05}.{}", dsc_format::STAGING_SUFFIX));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| {
                output_err(&dir, "remove what a killed append left in the cache", e)
            })?;
        }
        std::fs::create_dir_all(dir.join(dsc_format::SHARDS_DIR))
            .map_err(|e| output_err(&dir, "create the append's staging folder", e))?;
        Ok(Staging {
            dir,
            storage: crate::codec::Storage::Hot,
            out: root,
            committed: false,
            _lock: lock,
        })
    }

    /// Commits a generation of `cache`: the staging folder moved to `folder` (relative to the
    /// cache), then the manifest created under `manifest` only if no file has that name (a
    /// hard link of a complete file: readers see all of it or nothing, and a second writer
    /// cannot replace it). Returns the manifest's path.
    pub fn commit_generation(
        mut self,
        cache: &Path,
        number: u32,
        (folder, manifest): (&str, &str),
        json: &[u8],
    ) -> Result<PathBuf> {
        let out = cache.join(folder);
        if out.exists() {
            // A killed append of the same bytes left it: no manifest names it.
            std::fs::remove_dir_all(&out)
                .map_err(|e| output_err(&out, "remove what a killed append left", e))?;
        }
        std::fs::rename(&self.dir, &out)
            .map_err(|e| output_err(&out, "move the new generation into place", e))?;
        // From here the staging name is gone; if the link fails, the folder stays for `dsc gc`
        // to remove: no manifest names it.
        self.committed = true;
        failpoint("append:moved");
        let path = cache.join(manifest);
        let tmp = sibling(&path, "tmp");
        let mut f = File::create(&tmp).map_err(|e| CompileError::io(&tmp, e))?;
        f.write_all(json).map_err(|e| CompileError::io(&tmp, e))?;
        f.sync_all().map_err(|e| CompileError::io(&tmp, e))?;
        failpoint("append:manifest-written");
        let linked = std::fs::hard_link(&tmp, &path);
        failpoint("append:linked");
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(CompileError::GenerationTaken {
                    path: cache.into(),
                    number,
                })
            }
            Err(e) => return Err(output_err(&path, "commit the new generation", e)),
        }
        if let Some(parent) = path.parent() {
            if let Ok(d) = File::open(parent) {
                let _ = d.sync_all();
            }
        }
        Ok(path)
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

    /// Moves the finished cache to `out`, replacing what was there. Whatever moment the process
    /// dies, `out` is either the old cache or the new one, never missing: an existing `out` is
    /// exchanged with the staging directory in one atomic rename (Linux `RENAME_EXCHANGE`), and
    /// the old cache, now under the staging name, is moved to a leftover name of its own and
    /// returned, for its holder to remove ([`Replaced`]). Where the exchange is not available,
    /// the old cache is moved aside first (a short window without `out`).
    pub fn commit(mut self) -> Result<(PathBuf, Option<Replaced>)> {
        if self.out.exists() && !is_empty_dir(&self.out)? {
            let swapped = exchange(&self.dir, &self.out)
                .map_err(|e| output_err(&self.out, "replace the cache", e))?;
            if swapped {
                self.committed = true;
                // `self.dir` now holds the replaced cache: a reader refuses it by its name.
                return Ok((self.out.clone(), replaced(&self.dir, &self.out)));
            }
            let old = sibling(&self.out, dsc_format::REPLACED_SUFFIX);
            std::fs::rename(&self.out, &old)
                .map_err(|e| output_err(&self.out, "replace the cache", e))?;
            std::fs::rename(&self.dir, &self.out).map_err(|e| CompileError::io(&self.out, e))?;
            self.committed = true;
            return Ok((self.out.clone(), replaced(&old, &self.out)));
        }
        if self.out.exists() {
            // An empty directory: rename(2) replaces it.
            std::fs::remove_dir(&self.out)
                .map_err(|e| output_err(&self.out, "replace the empty output folder", e))?;
        }
        std::fs::rename(&self.dir, &self.out)
            .map_err(|e| output_err(&self.out, "move the new cache into place", e))?;
        self.committed = true;
        Ok((self.out.clone(), None))
    }
}

/// The replaced cache at `dir`, moved to a leftover name of its own. The compile has succeeded
/// by then, so a failure does not fail it: the folder is removed here instead, or stays under a
/// name readers refuse, for the next compile into the same output to remove or say why not.
fn replaced(dir: &Path, out: &Path) -> Option<Replaced> {
    match Replaced::take(dir, out) {
        Ok(r) => Some(r),
        Err(_) => {
            crate::replaced::remove_leftover(dir);
            None
        }
    }
}

/// Swaps two directories in one atomic step; `Ok(false)` where the platform or file system
/// cannot.
#[allow(unsafe_code)]
fn exchange(a: &Path, b: &Path) -> std::io::Result<bool> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_bytes())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        };
        let (ca, cb) = (c(a)?, c(b)?);
        // SAFETY: two valid NUL-terminated paths, resolved against the working directory; the
        // call only renames.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                ca.as_ptr(),
                libc::AT_FDCWD,
                cb.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        // Kernels or file systems without the flag: fall back to two renames.
        if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
            return Ok(false);
        }
        Err(e)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = (a, b);
        Ok(false)
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
    /// Written here, renamed to `path` when complete: two tasks writing the same shard (a
    /// retried or duplicated partition) never interleave their bytes in one file.
    tmp: PathBuf,
    out: BufWriter<File>,
    hasher: Hasher,
    bytes: u64,
    /// Bytes from the start whose writing to disk the kernel was asked to start.
    written_back: u64,
    /// Time spent hashing and writing, for the compile's phases.
    times: Split,
}

/// Bytes of a shard left to the page cache before the kernel is asked to start writing them.
/// Left alone, it writes nothing until the `fsync` that makes the shard durable, and that
/// thread waits (idle) for the whole shard: on 2 cores about two thirds of the write phase's
/// thread-seconds. Started early, the disk writes while the compile encodes, and the `fsync`
/// waits for the last few MiB.
const WRITE_BACK_EVERY: u64 = 2 << 20;

/// Asks the kernel to start writing `len` bytes of `file` from `offset` to disk, without waiting
/// for them. Advisory: an error here is the `fsync`'s to report.
#[allow(unsafe_code)]
fn start_write_back(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: the descriptor is open for the call's duration; the call reads no memory.
        unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

impl ShardWriter {
    pub fn create(path: PathBuf) -> Result<ShardWriter> {
        let tmp = path.with_extension(format!("safetensors.{}.tmp", std::process::id()));
        let file = File::create(&tmp).map_err(|e| CompileError::io(&tmp, e))?;
        Ok(ShardWriter {
            path,
            tmp,
            out: BufWriter::with_capacity(1 << 20, file),
            hasher: Hasher::new(),
            bytes: 0,
            written_back: 0,
            times: Split::default(),
        })
    }

    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let start = Instant::now();
        self.hasher.update(bytes);
        let hashed = Instant::now();
        self.times.checksums += hashed - start;
        self.bytes += bytes.len() as u64;
        let written = self
            .out
            .write_all(bytes)
            .map_err(|e| CompileError::io(&self.tmp, e));
        let in_file = self.bytes - self.out.buffer().len() as u64;
        if written.is_ok() && in_file - self.written_back >= WRITE_BACK_EVERY {
            start_write_back(
                self.out.get_ref(),
                self.written_back,
                in_file - self.written_back,
            );
            self.written_back = in_file;
        }
        self.times.write += hashed.elapsed();
        written
    }

    /// Flushes, renames into place and returns (size, xxh3).
    pub fn finish(self) -> Result<(u64, String)> {
        self.finish_timed().map(|(bytes, xxh3, _)| (bytes, xxh3))
    }

    /// [`ShardWriter::finish`], with the time spent hashing and writing (flush and rename
    /// included).
    pub fn finish_timed(mut self) -> Result<(u64, String, Split)> {
        let start = Instant::now();
        let file = self
            .out
            .into_inner()
            .map_err(|e| CompileError::io(&self.tmp, e.into_error()))?;
        file.sync_all()
            .map_err(|e| CompileError::io(&self.tmp, e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| CompileError::io(&self.path, e))?;
        self.times.write += start.elapsed();
        Ok((self.bytes, self.hasher.hex(), self.times))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_swaps_two_directories_in_one_step() {
        let tmp = std::env::temp_dir().join(format!("dsc-exchange-{}", std::process::id()));
        let (a, b) = (tmp.join("a"), tmp.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("which"), "a").unwrap();
        std::fs::write(b.join("which"), "b").unwrap();
        if exchange(&a, &b).unwrap() {
            assert_eq!(std::fs::read_to_string(a.join("which")).unwrap(), "b");
            assert_eq!(std::fs::read_to_string(b.join("which")).unwrap(), "a");
        }
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
