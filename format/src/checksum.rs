//! Content hashes: xxh3-64, written as 16 lower-case hex digits.

use crate::FormatError;
use std::io::Read;
use std::path::Path;
use xxhash_rust::xxh3::Xxh3;

/// The xxh3-64 of `bytes`.
pub fn xxh3(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The xxh3-64 of `bytes` as 16 hex digits.
pub fn xxh3_hex(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// Checks that `found`, the hash of the file at `path`, is `expected`.
pub fn check(found: String, expected: &str, path: &Path) -> Result<(), FormatError> {
    if found == expected {
        return Ok(());
    }
    Err(FormatError::Checksum {
        shard: path.into(),
        expected: expected.into(),
        found,
    })
}

/// An incremental xxh3-64 hasher, for data written in pieces.
#[derive(Default, Clone)]
pub struct Hasher(Xxh3);

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hasher")
    }
}

impl Hasher {
    /// A fresh hasher.
    pub fn new() -> Self {
        Hasher(Xxh3::new())
    }
    /// Feeds more bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    /// The hash of everything fed so far, as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0.digest())
    }
}

/// The size and xxh3-64 of a whole file, read in 1 MiB pieces.
pub fn hash_file(path: &Path) -> Result<(u64, String), FormatError> {
    let mut file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| FormatError::io(path, e))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((total, hasher.hex()))
}
