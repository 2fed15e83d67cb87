//! The parsers of untrusted bytes (a shard's safetensors header, `manifest.json`) return an
//! error, never panic or over-allocate, whatever the bytes: arbitrary ones, and real ones with
//! a byte changed.

use crate::util::*;
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// A real manifest and a real shard header, to mutate.
fn samples() -> &'static (Vec<u8>, Vec<u8>, u64) {
    static S: OnceLock<(Vec<u8>, Vec<u8>, u64)> = OnceLock::new();
    S.get_or_init(|| {
        let dir = small_icecube_cache();
        let manifest = std::fs::read(dir.join("cache/manifest.json")).unwrap();
        let shard = std::fs::read(dir.join("cache/shards/train-00000.safetensors")).unwrap();
        let n = u64::from_le_bytes(shard[..8].try_into().unwrap()) as usize;
        (manifest, shard[8..8 + n].to_vec(), shard.len() as u64)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_header_of_arbitrary_bytes_is_an_error(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        file_len in any::<u64>(),
    ) {
        let _ = dsc_format::shard::parse_header(&bytes, file_len, Path::new("s"));
    }

    #[test]
    fn a_manifest_of_arbitrary_bytes_is_an_error(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        prop_assert!(dsc_format::Manifest::from_json(&bytes, Path::new("m")).is_err());
    }

    #[test]
    fn a_real_header_with_one_byte_changed_parses_or_is_an_error(
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
        file_len_delta in -64i64..64,
    ) {
        let (_, header, len) = samples();
        let mut h = header.clone();
        let i = at.index(h.len());
        h[i] = value;
        let len = len.saturating_add_signed(file_len_delta);
        if let Ok(layout) = dsc_format::shard::parse_header(&h, len, Path::new("s")) {
            // Whatever it accepted lies inside the file.
            for t in &layout.tensors {
                prop_assert!(t.start <= t.end && t.end <= len);
            }
        }
    }

    #[test]
    fn a_real_manifest_with_one_byte_changed_is_valid_or_an_error(
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
    ) {
        let (manifest, _, _) = samples();
        let mut m = manifest.clone();
        let i = at.index(m.len());
        m[i] = value;
        // Whatever parses is valid by construction; it must also survive its own round trip.
        if let Ok(parsed) = dsc_format::Manifest::from_json(&m, Path::new("m")) {
            let again = dsc_format::Manifest::from_json(&parsed.to_json(), Path::new("m"));
            prop_assert_eq!(again.ok(), Some(parsed));
        }
    }
}
