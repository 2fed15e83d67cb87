//! A shard header of any bytes, for a file of any length: an error, or a layout whose tensors
//! tile the file from the data start to its end (what the loader maps without further checks).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Some((len, json)) = data.split_first_chunk::<8>() else {
        return;
    };
    // The file is at least as long as its prefix and header, as `read_layout` guarantees.
    let file_len = u64::from_le_bytes(*len).max(8 + json.len() as u64);
    if let Ok(layout) = dsc_format::shard::parse_header(json, file_len, Path::new("fuzz")) {
        let mut at = layout.data_start;
        for t in &layout.tensors {
            assert_eq!(t.start, at, "tensor {} leaves a hole or overlaps", t.name);
            assert!(t.end >= t.start && t.end <= file_len);
            at = t.end;
        }
        assert_eq!(at, file_len);
    }
});
