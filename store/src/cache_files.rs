//! A cache in object storage as the format's readers take its files
//! ([`dsc_format::generation::CacheFiles`]): each file an object, the generations listed from
//! the `generations/` folder alone.

use crate::{Remote, StoreError};
use dsc_format::generation::{numbers_in, CacheFiles};

impl CacheFiles for Remote {
    fn read(&mut self, name: &str) -> std::io::Result<Vec<u8>> {
        self.get(name).map_err(as_io)
    }

    fn generations(&mut self) -> std::io::Result<Vec<u32>> {
        let names = self.list_in(dsc_format::GENERATIONS_DIR).map_err(as_io)?;
        // Manifests sit at the top of the folder; files of generations' folders do not count.
        Ok(numbers_in(
            names
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| !n.contains('/')),
        ))
    }
}

/// A store's error as the I/O error the format's readers take: a missing object stays
/// `NotFound`, so that a missing generation is named as such.
pub fn as_io(e: StoreError) -> std::io::Error {
    let kind = match e {
        StoreError::NotFound { .. } => std::io::ErrorKind::NotFound,
        _ => std::io::ErrorKind::Other,
    };
    std::io::Error::new(kind, e.to_string())
}
