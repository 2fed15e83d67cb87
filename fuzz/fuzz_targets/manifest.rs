//! A manifest of any bytes: an error, or a manifest (valid by construction) that writes itself
//! back and reads back equal.
#![no_main]

use dsc_format::Manifest;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::from_json(data, Path::new("fuzz")) {
        let again = Manifest::from_json(&m.to_json(), Path::new("fuzz")).expect("own JSON reads");
        assert_eq!(again, m);
    }
});
