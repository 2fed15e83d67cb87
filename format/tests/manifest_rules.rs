//! Each rule of a manifest, broken on its own in an otherwise valid manifest, is refused with
//! its own typed problem (what `dsc verify`, the loader and the Python package report).

use dsc_format::manifest::{Inputs, ShardEntry};
use dsc_format::{
    ColumnSource, ColumnSpec, CompileSpec, Encoding, FormatError, Manifest, ManifestProblem,
    TensorRole, TensorSpec,
};
use serde_json::{json, Value};
use std::path::Path;

fn tensor(name: &str, role: TensorRole, shape: Vec<usize>, width: usize) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dtype: role.dtype(),
        role,
        sample_shape: shape,
        columns: (0..width)
            .map(|i| ColumnSpec {
                name: format!("{name}{i}"),
                source: ColumnSource::Rows,
                source_type: "Float64".into(),
                encoding: Encoding::Raw,
            })
            .collect(),
    }
}

fn shard(split: &str, index: usize, first: usize, contexts: usize) -> ShardEntry {
    ShardEntry {
        file: dsc_format::shard::shard_file_name(split, index),
        split: split.into(),
        index,
        contexts,
        first_context: first,
        bytes: 1,
        xxh3: "0".repeat(16),
        compressed: None,
        keys: None,
        generation: None,
        removed: Vec::new(),
    }
}

/// A valid manifest: L = 4, two train shards, one val shard, as JSON.
fn valid() -> Value {
    let tensors = vec![
        tensor("key", TensorRole::Key, vec![], 1),
        tensor("length", TensorRole::Length, vec![], 1),
        tensor("x", TensorRole::Features, vec![4, 2], 2),
        tensor("y", TensorRole::Targets, vec![1], 1),
    ];
    let inputs = Inputs {
        fingerprint: "0".repeat(16),
        files: vec![],
    };
    let m = Manifest::builder("0.1.0", 4, tensors, inputs, CompileSpec::new(vec![], "k"))
        .split(
            "train",
            9,
            vec![shard("train", 0, 0, 3), shard("train", 1, 3, 2)],
        )
        .split("val", 1, vec![shard("val", 0, 0, 1)])
        .build()
        .unwrap();
    assert_eq!(m.split("train").unwrap().contexts, 5);
    assert_eq!(m.split("val").unwrap().shards, 1);
    serde_json::from_slice(&m.to_json()).unwrap()
}

fn problem(m: &Value) -> ManifestProblem {
    let bytes = serde_json::to_vec(m).unwrap();
    match Manifest::from_json(&bytes, Path::new("manifest.json")) {
        Err(FormatError::InvalidManifest { problem, .. }) => problem,
        other => panic!("expected an invalid manifest, got {other:?}"),
    }
}

#[test]
fn a_valid_manifest_reads_back_equal() {
    let m = valid();
    let bytes = serde_json::to_vec(&m).unwrap();
    let read = Manifest::from_json(&bytes, Path::new("m")).unwrap();
    assert_eq!(serde_json::to_value(&read).unwrap(), m);
}

#[test]
fn each_broken_rule_is_its_own_problem() {
    type Edit = fn(&mut Value);
    type Expect = fn(&ManifestProblem) -> bool;
    let cases: Vec<(&str, Edit, Expect)> = vec![
        (
            "duplicate tensor",
            |m| m["tensors"][3]["name"] = json!("x"),
            |p| matches!(p, ManifestProblem::DuplicateTensor { .. }),
        ),
        (
            "rank",
            |m| m["tensors"][2]["sample_shape"] = json!([4]),
            |p| matches!(p, ManifestProblem::Rank { expected: 2, .. }),
        ),
        (
            "dtype",
            |m| m["tensors"][1]["dtype"] = json!("F32"),
            |p| matches!(p, ManifestProblem::Dtype { .. }),
        ),
        (
            "impossible shape",
            |m| m["tensors"][3]["sample_shape"] = json!([1u64 << 62]),
            |p| matches!(p, ManifestProblem::ImpossibleShape { .. }),
        ),
        (
            "sequence axis",
            |m| m["tensors"][2]["sample_shape"] = json!([5, 2]),
            |p| {
                matches!(
                    p,
                    ManifestProblem::SequenceAxis {
                        expected: 4,
                        found: 5,
                        ..
                    }
                )
            },
        ),
        (
            "columns",
            |m| {
                m["tensors"][2]["columns"]
                    .as_array_mut()
                    .unwrap()
                    .truncate(1)
            },
            |p| {
                matches!(
                    p,
                    ManifestProblem::Columns {
                        found: 1,
                        width: 2,
                        ..
                    }
                )
            },
        ),
        (
            "missing length",
            |m| m["tensors"][1]["name"] = json!("len"),
            |p| matches!(p, ManifestProblem::MissingTensor { tensor: "length" }),
        ),
        (
            "key not first",
            |m| m["tensors"].as_array_mut().unwrap().swap(0, 1),
            |p| matches!(p, ManifestProblem::KeyNotFirst { keys: 1, .. }),
        ),
        (
            "split name",
            |m| {
                m["splits"][1]["name"] = json!("../x");
                m["shards"][2]["split"] = json!("../x");
            },
            |p| matches!(p, ManifestProblem::SplitName { .. }),
        ),
        (
            "duplicate split",
            |m| m["splits"][1]["name"] = json!("train"),
            |p| matches!(p, ManifestProblem::DuplicateSplit { .. }),
        ),
        (
            "split shards",
            |m| m["splits"][0]["shards"] = json!(3),
            |p| {
                matches!(
                    p,
                    ManifestProblem::SplitShards {
                        said: 3,
                        listed: 2,
                        ..
                    }
                )
            },
        ),
        (
            "split contexts",
            |m| m["splits"][0]["contexts"] = json!(6),
            |p| {
                matches!(
                    p,
                    ManifestProblem::SplitContexts {
                        said: 6,
                        held: 5,
                        ..
                    }
                )
            },
        ),
        (
            "shard name",
            |m| m["shards"][1]["index"] = json!(2),
            |p| matches!(p, ManifestProblem::ShardName { .. }),
        ),
        (
            "shard start",
            |m| m["shards"][1]["first_context"] = json!(4),
            |p| {
                matches!(
                    p,
                    ManifestProblem::ShardStart {
                        found: 4,
                        expected: 3,
                        ..
                    }
                )
            },
        ),
        (
            "unknown split",
            |m| {
                let mut extra = m["shards"][2].clone();
                extra["split"] = json!("test");
                m["shards"].as_array_mut().unwrap().push(extra);
            },
            |p| matches!(p, ManifestProblem::UnknownSplit { .. }),
        ),
    ];
    for (name, edit, expected) in cases {
        let mut m = valid();
        edit(&mut m);
        let p = problem(&m);
        assert!(expected(&p), "{name}: got {p:?} ({p})");
    }
}
