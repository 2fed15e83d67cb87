//! A cache's generations: the first is `manifest.json`; each `dsc append` (or `dsc compact`)
//! commits the next as `generations/{NNNNN}.json`, created only if absent, beside the folder
//! `generations/{NNNNN}/` of the shards and `stats.json` it added. No file of an earlier
//! generation ever changes, so a reader that opened one keeps reading exactly it. Readers take
//! the last generation unless told which ([`GenerationRef`]); FORMAT.md §14.

use crate::manifest::{generation_manifest_name, Manifest};
use crate::{FormatError, GENERATIONS_DIR};
use std::path::Path;

/// Which generation of a cache to open.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GenerationRef {
    /// The last one committed.
    #[default]
    Latest,
    /// By number (1 is the compiled cache).
    Number(u32),
    /// By content id (`Manifest::content_id`, or the stored id of a compressed cache).
    Id(String),
    /// By a name given with `dsc tag`.
    Tag(String),
}

impl std::str::FromStr for GenerationRef {
    type Err = String;

    /// `latest`, a number (`3`), a content id (16 hex digits) or a tag's name.
    fn from_str(s: &str) -> Result<GenerationRef, String> {
        if s == "latest" {
            return Ok(GenerationRef::Latest);
        }
        if !s.is_empty() && s.len() < 10 && s.bytes().all(|b| b.is_ascii_digit()) {
            return match s.parse::<u32>() {
                Ok(0) | Err(_) => Err(format!("generation {s:?}: generations count from 1")),
                Ok(n) => Ok(GenerationRef::Number(n)),
            };
        }
        if s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(GenerationRef::Id(s.to_ascii_lowercase()));
        }
        match tag_name_problem(s) {
            None => Ok(GenerationRef::Tag(s.into())),
            Some(p) => Err(format!(
                "generation {s:?}: not a number, a content id (16 hex digits) or a tag ({p})"
            )),
        }
    }
}

impl std::fmt::Display for GenerationRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GenerationRef::Latest => f.write_str("latest"),
            GenerationRef::Number(n) => write!(f, "{n}"),
            GenerationRef::Id(id) => f.write_str(id),
            GenerationRef::Tag(t) => f.write_str(t),
        }
    }
}

/// Why `name` cannot be a tag: tags are files under `generations/tags/`, so a name is a
/// lower-case letter followed by letters, digits, `-`, `_` and `.` (at most 64), and cannot be
/// read as a number or a content id.
pub fn tag_name_problem(name: &str) -> Option<&'static str> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c);
    if name.is_empty() || name.len() > 64 {
        Some("a tag has 1 to 64 characters")
    } else if !name.starts_with(|c: char| c.is_ascii_lowercase()) || !name.chars().all(ok_char) {
        Some("a tag starts with a lower-case letter and holds a-z, 0-9, '-', '_', '.'")
    } else if name == "latest" {
        Some("`latest` always means the last generation")
    } else if name.len() == 16 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        Some("16 hex digits would read as a content id")
    } else {
        None
    }
}

/// `generations/tags/{name}`: the file naming a tagged generation (its number, in decimal).
pub fn tag_file_name(name: &str) -> String {
    format!("{GENERATIONS_DIR}/tags/{name}")
}

/// The numbers of the generations after the first among the names of the entries of the
/// `generations/` folder (`NNNNN.json`), ascending.
pub fn numbers_in<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Vec<u32> {
    let mut numbers: Vec<u32> = names
        .into_iter()
        .filter_map(|n| {
            let stem = n.as_ref().strip_suffix(".json")?;
            let digits = stem.len() >= 5 && stem.bytes().all(|b| b.is_ascii_digit());
            stem.parse().ok().filter(|&g| digits && g >= 2)
        })
        .collect();
    numbers.sort_unstable();
    numbers.dedup();
    numbers
}

/// The generations after the first of the cache at `dir`, ascending (none when it was never
/// appended to).
pub fn listed(dir: &Path) -> std::io::Result<Vec<u32>> {
    let folder = dir.join(GENERATIONS_DIR);
    match std::fs::read_dir(&folder) {
        Ok(entries) => Ok(numbers_in(
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Where a cache's files come from, for [`Manifest::open_generation`]: a local folder, a
/// folder held open, or object storage.
pub trait CacheFiles {
    /// The bytes of the file `name`, relative to the cache.
    fn read(&mut self, name: &str) -> std::io::Result<Vec<u8>>;
    /// The generations after the first ([`listed`]).
    fn generations(&mut self) -> std::io::Result<Vec<u32>>;
}

/// A local cache directory, read by path.
#[derive(Debug)]
pub struct LocalFiles<'a>(pub &'a Path);

impl CacheFiles for LocalFiles<'_> {
    fn read(&mut self, name: &str) -> std::io::Result<Vec<u8>> {
        std::fs::read(self.0.join(name))
    }

    fn generations(&mut self) -> std::io::Result<Vec<u32>> {
        listed(self.0)
    }
}

/// The generations a cache has, for messages: `generations 1 to 4`, or the numbers where
/// some were removed (`generations 1, 4, 5`).
fn describe(later: &[u32]) -> String {
    let all: Vec<u32> = std::iter::once(1).chain(later.iter().copied()).collect();
    let last = *all.last().expect("never empty");
    if all.len() == 1 {
        "generation 1 only".into()
    } else if all.len() as u32 == last {
        format!("generations 1 to {last}")
    } else {
        let list: Vec<String> = all.iter().map(u32::to_string).collect();
        format!("generations {}", list.join(", "))
    }
}

impl Manifest {
    /// Reads and validates generation `at` of the cache at `dir` from `files`. The first
    /// generation's `manifest.json` must exist whatever is asked: it is what makes `dir` a cache.
    pub fn open_generation(
        dir: &Path,
        at: &GenerationRef,
        files: &mut dyn CacheFiles,
    ) -> Result<Manifest, FormatError> {
        let first = Manifest::read_with(dir, |name| files.read(name))?;
        let generations = |files: &mut dyn CacheFiles| {
            files
                .generations()
                .map_err(|e| FormatError::io(dir.join(GENERATIONS_DIR), e))
        };
        let number = match at {
            GenerationRef::Latest => match generations(files)?.last() {
                Some(&n) => n,
                None => return Ok(first),
            },
            GenerationRef::Number(n) => *n,
            GenerationRef::Tag(name) => {
                let file = tag_file_name(name);
                let text = files.read(&file).map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => FormatError::NoGeneration {
                        dir: dir.into(),
                        asked: format!("tag {name:?}"),
                        have: "no such tag".into(),
                    },
                    _ => FormatError::io(dir.join(&file), e),
                })?;
                String::from_utf8_lossy(&text).trim().parse().map_err(|_| {
                    FormatError::io(
                        dir.join(&file),
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "a tag file holds a generation number",
                        ),
                    )
                })?
            }
            GenerationRef::Id(id) => {
                if first.content_id() == *id || first.stored_id() == *id {
                    return Ok(first);
                }
                for n in generations(files)? {
                    let m = Self::read_numbered(dir, n, files)?;
                    if m.content_id() == *id || m.stored_id() == *id {
                        return Ok(m);
                    }
                }
                return Err(FormatError::NoGeneration {
                    dir: dir.into(),
                    asked: format!("content id {id}"),
                    have: "no generation has it (`dsc log` lists them)".into(),
                });
            }
        };
        if number == 1 {
            return Ok(first);
        }
        Self::read_numbered(dir, number, files).map_err(|e| match e {
            FormatError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                let have = match generations(files) {
                    Ok(g) => describe(&g),
                    Err(e) => e.to_string(),
                };
                FormatError::NoGeneration {
                    dir: dir.into(),
                    asked: format!("generation {number}"),
                    have,
                }
            }
            e => e,
        })
    }

    /// Generation `n > 1`'s manifest, checked to be the generation its name says.
    fn read_numbered(
        dir: &Path,
        n: u32,
        files: &mut dyn CacheFiles,
    ) -> Result<Manifest, FormatError> {
        let name = generation_manifest_name(n);
        let path = dir.join(&name);
        let bytes = files.read(&name).map_err(|e| FormatError::io(&path, e))?;
        let m = Manifest::from_json(&bytes, &path)?;
        if m.generation_number() != n {
            return Err(FormatError::InvalidManifest {
                path,
                problem: crate::ManifestProblem::GenerationNumber {
                    found: m.generation_number(),
                    expected: n,
                },
            });
        }
        Ok(m)
    }

    /// Every generation of the cache at `dir`, first to last.
    pub fn lineage(dir: &Path, files: &mut dyn CacheFiles) -> Result<Vec<Manifest>, FormatError> {
        let mut all = vec![Manifest::read_with(dir, |name| files.read(name))?];
        let numbers = files
            .generations()
            .map_err(|e| FormatError::io(dir.join(GENERATIONS_DIR), e))?;
        for n in numbers {
            all.push(Self::read_numbered(dir, n, files)?);
        }
        Ok(all)
    }

    /// Generation `at` of the local cache at `dir`.
    pub fn read_at(dir: &Path, at: &GenerationRef) -> Result<Manifest, FormatError> {
        Self::open_generation(dir, at, &mut LocalFiles(dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_as_a_user_writes_them() {
        assert_eq!("latest".parse(), Ok(GenerationRef::Latest));
        assert_eq!("3".parse(), Ok(GenerationRef::Number(3)));
        assert!("0".parse::<GenerationRef>().is_err());
        assert_eq!(
            "09E1549532A80266".parse(),
            Ok(GenerationRef::Id("09e1549532a80266".into()))
        );
        assert_eq!(
            "nightly-2026-11".parse(),
            Ok(GenerationRef::Tag("nightly-2026-11".into()))
        );
        assert!("Nightly".parse::<GenerationRef>().is_err());
        assert!("../x".parse::<GenerationRef>().is_err());
    }

    #[test]
    fn only_numbered_manifests_are_generations() {
        let names = [
            "00002.json",
            "00010.json",
            "00002",
            "tags",
            "1.json",
            "00001.json",
            "x.json",
        ];
        assert_eq!(numbers_in(names), vec![2, 10]);
    }
}
