//! Shards open with the Python `safetensors` package and hold exactly the bytes that the Rust
//! reader (checked against the source Parquet in `values`) sees.

use crate::util::*;
use std::path::PathBuf;

#[test]
fn python_safetensors_reads_every_shard_identically() {
    let dir = small_icecube_cache();
    let cache = dir.join("cache");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/check_shards.py");
    let out = std::process::Command::new(python())
        .arg(&script)
        .arg(&cache)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = manifest(&cache);
    let shards = m["shards"].as_array().unwrap();
    assert!(shards.len() > 2);
    for shard in shards {
        let file = shard["file"].as_str().unwrap();
        let rust = read_shard(&cache.join(file));
        let from_py = py[file].as_object().unwrap();
        assert_eq!(from_py.len(), rust.len(), "{file}: tensor count");
        for (name, t) in &rust {
            let p = &from_py[name];
            let dtype = match t.dtype.as_str() {
                "F32" => "float32",
                "I32" => "int32",
                "I64" => "int64",
                other => panic!("{other}"),
            };
            assert_eq!(p["dtype"], dtype, "{file}/{name}");
            assert_eq!(p["shape"], serde_json::json!(t.shape), "{file}/{name}");
            let sum: u64 = t
                .bytes
                .chunks_exact(4)
                .map(|c| u64::from(u32::from_le_bytes(c.try_into().unwrap())))
                .sum();
            assert_eq!(p["u32sum"].as_u64().unwrap(), sum, "{file}/{name} bytes");
        }
    }
}
