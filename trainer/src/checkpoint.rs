//! Checkpoints: one safetensors file holding the model weights (`model.*`, loadable by any
//! safetensors reader), the optimizer and loss-scale state (`optim.*`, `scaler.*`), and in its
//! metadata the run configuration, the schedule position, the loader's resume state and the
//! history so far. Written to a temporary file and renamed, so a crash never leaves half a
//! checkpoint.

use crate::config::RunConfig;
use crate::error::{Result, TrainError};
use crate::readback;
use crate::report::EpochReport;
use dsc_loader::State;
use safetensors::tensor::{Dtype as StDtype, TensorView};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

const META_KEY: &str = "dsc_train";

/// Where the run stands; saved in the checkpoint's metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Position {
    /// The run's configuration.
    pub config: RunConfig,
    /// Epoch in progress (or the next one when `loader` is `None`).
    pub epoch: u64,
    /// Micro-batches of `epoch` already trained.
    pub micro_in_epoch: u64,
    /// Optimizer steps taken in all.
    pub optimizer_steps: u64,
    /// The training loader's state after the last batch trained (None at an epoch boundary).
    pub loader: Option<State>,
    /// Summaries of the finished epochs.
    pub history: Vec<EpochReport>,
    /// The cache's input fingerprint: a resumed run must read the same data.
    pub cache_fingerprint: String,
    /// The cache's content identity (`Manifest::content_id`: its shards' names and checksums;
    /// a mix's joined by `+`, [`content_of`]): a resumed run must read the same shards, or the
    /// saved position would continue another order. Absent in checkpoints from before it was
    /// recorded.
    #[serde(default)]
    pub cache_content: Option<String>,
}

/// The content identity of the caches a run reads: each one's `content_id`, joined by `+`.
pub fn content_of<'a>(manifests: impl IntoIterator<Item = &'a dsc_format::Manifest>) -> String {
    manifests
        .into_iter()
        .map(dsc_format::Manifest::content_id)
        .collect::<Vec<_>>()
        .join("+")
}

/// [`content_of`] as checkpoints of compressed caches recorded it before the content id left
/// storage out ([`dsc_format::Manifest::stored_id`]): accepted on resume too.
pub fn stored_content_of<'a>(
    manifests: impl IntoIterator<Item = &'a dsc_format::Manifest>,
) -> String {
    manifests
        .into_iter()
        .map(dsc_format::Manifest::stored_id)
        .collect::<Vec<_>>()
        .join("+")
}

impl Position {
    /// The start of a run on a cache with input fingerprint `cache_fingerprint` and content
    /// identity `cache_content`.
    pub fn start(config: RunConfig, cache_fingerprint: String, cache_content: String) -> Position {
        Position {
            cache_fingerprint,
            cache_content: Some(cache_content),
            config,
            epoch: 0,
            micro_in_epoch: 0,
            optimizer_steps: 0,
            loader: None,
            history: Vec::new(),
        }
    }
}

/// A loaded checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// Where the run stands and how it got there.
    pub position: Position,
    tensors: HashMap<String, Tensor>,
    path: PathBuf,
}

impl Checkpoint {
    /// The saved tensor `name` on `device`.
    pub fn tensor(&self, name: &str, device: Device) -> Result<Tensor> {
        self.tensors
            .get(name)
            .map(|t| t.to_device(device))
            .ok_or_else(|| TrainError::checkpoint(&self.path, format!("no tensor {name:?}")))
    }

    /// Reads and checks the checkpoint at `path`.
    pub fn read(path: &Path) -> Result<Checkpoint> {
        let bad = |what: String| TrainError::checkpoint(path, what);
        let bytes = std::fs::read(path).map_err(|e| TrainError::io(path, e))?;
        let (_, meta) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(format!("not a safetensors checkpoint: {e}")))?;
        let json = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META_KEY))
            .ok_or_else(|| {
                bad(format!(
                    "not a dsc-train checkpoint (no {META_KEY} metadata)"
                ))
            })?;
        let position: Position = serde_json::from_str(json)
            .map_err(|e| bad(format!("unreadable {META_KEY} metadata: {e}")))?;
        let st =
            SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("corrupt tensors: {e}")))?;
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            let kind = match view.dtype() {
                StDtype::F32 => Kind::Float,
                StDtype::I32 => Kind::Int,
                StDtype::I64 => Kind::Int64,
                other => return Err(bad(format!("tensor {name} has dtype {other:?}"))),
            };
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            let t = Tensor::f_from_data_size(view.data(), &shape, kind)
                .map_err(|e| bad(format!("tensor {name}: {e}")))?;
            tensors.insert(name, t);
        }
        Ok(Checkpoint {
            position,
            tensors,
            path: path.to_path_buf(),
        })
    }
}

/// Writes a checkpoint atomically.
pub fn write(path: &Path, position: &Position, tensors: &[(String, Tensor)]) -> Result<()> {
    let bad = |what: String| TrainError::checkpoint(path, what);
    let host: Vec<(String, Vec<u8>, StDtype, Vec<usize>)> = tensors
        .iter()
        .map(|(name, t)| {
            let dtype = match t.kind() {
                Kind::Float => StDtype::F32,
                Kind::Int => StDtype::I32,
                Kind::Int64 => StDtype::I64,
                k => return Err(bad(format!("cannot checkpoint {name} of kind {k:?}"))),
            };
            let shape = t.size().iter().map(|&d| d as usize).collect();
            Ok((name.clone(), readback::bytes(t), dtype, shape))
        })
        .collect::<Result<_>>()?;
    let views = host
        .iter()
        .map(|(name, bytes, dtype, shape)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| bad(format!("tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let json = serde_json::to_string(position).expect("a position serialises");
    let meta = HashMap::from([(META_KEY.to_string(), json)]);
    let tmp = path.with_extension("ckpt.partial");
    safetensors::serialize_to_file(views, Some(meta), &tmp)
        .map_err(|e| TrainError::checkpoint(&tmp, format!("cannot be written: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| TrainError::io(path, e))?;
    Ok(())
}
