//! The form of a cache's shards ([`Storage`]): a leaf that the writer (which stages a compile's
//! shards in that form) and the conversions of `storage.rs` (which rewrite them) both name.

use crate::error::Result;
use dsc_format::spelling::OptionError;
use dsc_format::Codec;

/// The form of a cache's shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Storage {
    /// Safetensors files, mapped by the loader.
    #[default]
    Hot,
    /// One zstd frame per shard, at this level (1–22).
    Zstd {
        /// The zstd compression level.
        level: i32,
    },
}

impl Storage {
    pub(crate) fn codec(self) -> Option<Codec> {
        match self {
            Storage::Hot => None,
            Storage::Zstd { .. } => Some(Codec::Zstd),
        }
    }

    pub(crate) fn level(self) -> Option<i32> {
        match self {
            Storage::Hot => None,
            Storage::Zstd { level } => Some(level),
        }
    }

    /// Refuses a level zstd does not have.
    pub fn check(self) -> Result<Storage> {
        if let Storage::Zstd { level } = self {
            let max = *zstd::compression_level_range().end();
            if !(1..=max).contains(&level) {
                return Err(OptionError::new(
                    "compress_level",
                    format!("{level}: use 1 (fastest) to {max} (smallest) for zstd"),
                )
                .into());
            }
        }
        Ok(self)
    }
}
