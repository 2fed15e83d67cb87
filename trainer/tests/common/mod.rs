//! Helpers shared by the trainer's test binaries.

use std::path::Path;

/// Every f32 tensor of a safetensors file as its values, by name, in name order.
pub fn f32_tensors(path: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .filter(|(_, v)| v.dtype() == safetensors::Dtype::F32)
        .map(|(n, v)| {
            let vals = v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (n, vals)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
