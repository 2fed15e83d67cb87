//! A cache's `manifest.json` read from disk, with the errors a reader sees ([`FormatError`]):
//! the commit rule (a staging directory is never a cache), then the format's name and version
//! before the full structure, so that an old or new cache gets a version error rather than a
//! confusing field error. Apart from `manifest/` so that the manifest's own rules
//! ([`ManifestProblem`]) stay below the error that carries them.

use crate::manifest::{Manifest, ManifestFields, ManifestProblem, SUPPORTED_VERSIONS};
use crate::{FormatError, FORMAT_NAME, MANIFEST_FILE};
use serde::Deserialize;
use std::path::Path;

impl Manifest {
    /// Reads and validates the manifest of the last generation of the cache at `dir`
    /// (`manifest.json` when it was never appended to; [`Manifest::read_at`] for another).
    /// Refuses a compile's staging directory, whatever it holds: only a renamed, committed
    /// directory is a cache.
    pub fn read(dir: &Path) -> Result<Manifest, FormatError> {
        Self::read_at(dir, &crate::GenerationRef::Latest)
    }

    /// The first generation's manifest, `manifest.json`, with the file's bytes read by `read`
    /// from a name relative to `dir` (e.g. through a directory held open, so that the manifest
    /// comes from the directory the caller holds whatever later happens to the path).
    pub fn read_with(
        dir: &Path,
        read: impl FnOnce(&str) -> std::io::Result<Vec<u8>>,
    ) -> Result<Manifest, FormatError> {
        let staging = dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.starts_with('.')
                && [crate::STAGING_SUFFIX, crate::REPLACED_SUFFIX]
                    .iter()
                    .any(|s| n.ends_with(&format!(".{s}")))
        });
        if staging {
            return Err(FormatError::NotCommitted { dir: dir.into() });
        }
        let path = dir.join(MANIFEST_FILE);
        let bytes = match read(MANIFEST_FILE) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(if dir.is_dir() {
                    FormatError::NotACache { dir: dir.into() }
                } else {
                    FormatError::io(dir, e)
                })
            }
            Err(e) => return Err(FormatError::io(&path, e)),
        };
        let first = Self::from_json(&bytes, &path)?;
        // A later generation's manifest is never the cache's root, whatever was copied where.
        if first.generation_number() != 1 {
            return Err(FormatError::InvalidManifest {
                path,
                problem: ManifestProblem::GenerationNumber {
                    found: first.generation_number(),
                    expected: 1,
                },
            });
        }
        Ok(first)
    }

    /// Parses and validates manifest JSON; `path` is used in errors.
    pub fn from_json(bytes: &[u8], path: &Path) -> Result<Manifest, FormatError> {
        // Check the version before the full structure, so an old or new cache gets a version
        // error rather than a confusing field error.
        #[derive(Deserialize)]
        struct Head {
            format: Option<String>,
            format_version: Option<u32>,
        }
        let json_err = |source| FormatError::Json {
            path: path.into(),
            source,
        };
        let head: Head = serde_json::from_slice(bytes).map_err(json_err)?;
        let version = head.format_version.unwrap_or(0);
        if head.format.as_deref() != Some(FORMAT_NAME) {
            return Err(FormatError::InvalidManifest {
                path: path.into(),
                problem: ManifestProblem::NotThisFormat {
                    found: head.format,
                    version,
                },
            });
        }
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(FormatError::UnsupportedVersion {
                path: path.into(),
                found: version,
                supported: format!("{SUPPORTED_VERSIONS:?}"),
            });
        }
        // Parsed into the unchecked shape first, so that a rule broken is a typed problem
        // rather than text inside a JSON error.
        let fields: ManifestFields = serde_json::from_slice(bytes).map_err(json_err)?;
        Manifest::try_from(fields).map_err(|problem| FormatError::InvalidManifest {
            path: path.into(),
            problem,
        })
    }
}
