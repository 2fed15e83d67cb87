"""dsc, the dataset compiler: Parquet event and sequence data compiled once into pre-shuffled,
padded safetensors shards, and streamed into PyTorch at memory speed.

>>> import dsc
>>> cache = dsc.compile(rows="data/train/batch_*.parquet", key="event_id", order_by="time",
...                     features=["time", "charge"], out="cache")     # data: dsc gen icecube
>>> loader = dsc.Loader(cache, split="train", batch_size=256, seed=0)
>>> for batch in loader:
...     x, length = batch["x"], batch["length"]     # [256, L, 2] and [256]
>>> x.shape[0], x.shape[2]
(256, 2)

See docs/PYTHON.md for the whole API.
"""

from ._dsc import __version__
from ._errors import CacheError, CompileError, Error, OptionsError, StateError, WorkerError
from ._cache import Cache, TensorInfo, open
from ._compile import append, compile, compile_stage, merge
from ._batch import Batch
from ._loader import IterableDataset, Loader
from ._captured import CapturedStep, CaptureError

__all__ = [
    "Batch",
    "Cache",
    "CacheError",
    "CaptureError",
    "CapturedStep",
    "CompileError",
    "Error",
    "IterableDataset",
    "Loader",
    "OptionsError",
    "StateError",
    "TensorInfo",
    "WorkerError",
    "__version__",
    "append",
    "compile",
    "compile_stage",
    "merge",
    "open",
]
