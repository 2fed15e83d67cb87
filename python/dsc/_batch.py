"""`dsc.Batch`, what every path of the loader delivers, and the helpers the loader's modules
share (torch, imported only when present; the advice against worker processes)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from ._errors import OptionsError


def _torch():
    """torch, or None where it is not installed (dsc then gives NumPy arrays)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


FORK_ADVICE = (
"dsc loads batches with threads inside the training process, never with worker processes: "
    "pass the dsc.Loader (or dsc.IterableDataset with DataLoader(..., batch_size=None, "
    "num_workers=0)) to your loop directly, and raise num_threads for more loading threads"
)


class Batch(dict):
    """One batch: a ``dict`` of tensor name to ``torch.Tensor`` (or NumPy array), plus where it
    sits in the epoch. ``.to(device)`` and ``.pin_memory()`` return a new ``Batch`` (the
    DataLoader's pin thread calls ``pin_memory`` on custom types).

    Attributes: ``epoch``, ``step`` (the batch's index in the epoch), ``seq_len`` (the length of
    the sequence axis; for a pack, its longest sequence), ``valid`` (how many leading rows are
    contexts seen for the first time this epoch: all of them, except in the last batches of a
    ``drop_last=False`` epoch, which are completed with the epoch's first contexts; evaluate on
    ``batch["y"][:batch.valid]`` to count every context once).

    A packed batch (``Loader(pack=T)``) also has ``seqs`` and ``tokens`` (the sequences and
    tokens it holds: the leading rows of its ``[S, ...]`` and ``[T, ...]`` tensors) and
    ``max_seqlen`` (its longest sequence); ``valid`` is ``seqs``, or 0 for a pack repeated to
    complete the last global step. They are ``None`` for padded batches."""

    epoch: int
    step: int
    seq_len: int
    valid: int
    seqs: Optional[int]
    tokens: Optional[int]
    max_seqlen: Optional[int]

    def __init__(self, tensors: Dict[str, Any], epoch: int = 0, step: int = 0, seq_len: int = 0,
                 valid: Optional[int] = None, pack: Optional[Tuple[int, int, int]] = None):
        super().__init__(tensors)
        self.epoch = epoch
        self.step = step
        self.seq_len = seq_len
        self.seqs, self.tokens, self.max_seqlen = pack if pack is not None else (None, None, None)
        if valid is None:
            if self.seqs is not None:
                valid = self.seqs
            else:
                first = next(iter(tensors.values()), None)
                valid = 0 if first is None else len(first)
        self.valid = valid

    def __repr__(self) -> str:
        """One line: where the batch sits and each tensor's shape and type, not its values
        (a dict of tensors would print every number)."""
        def kind(t: Any) -> str:
            shape = "x".join(str(d) for d in t.shape)
            return f"{str(t.dtype).replace('torch.', '')}[{shape}]"
        tensors = ", ".join(f"{name}: {kind(t)}" for name, t in self.items())
        pack = "" if self.seqs is None else f", seqs={self.seqs}, tokens={self.tokens}"
        return (f"dsc.Batch(epoch={self.epoch}, step={self.step}, seq_len={self.seq_len}, "
                f"valid={self.valid}{pack}; {tensors})")

    @property
    def _pack(self) -> Optional[Tuple[int, int, int]]:
        return None if self.seqs is None else (self.seqs, self.tokens, self.max_seqlen)

    def _like(self, tensors: Dict[str, Any]) -> "Batch":
        return Batch(tensors, self.epoch, self.step, self.seq_len, self.valid, self._pack)

    def to(self, *args: Any, **kwargs: Any) -> "Batch":
        """``tensor.to(*args, **kwargs)`` for every tensor, e.g. ``batch.to("cuda",
        non_blocking=True)``."""
        self._need_torch("to")
        return self._like({k: v.to(*args, **kwargs) for k, v in self.items()})

    def pin_memory(self, *args: Any) -> "Batch":
        """Every tensor in page-locked memory (a copy)."""
        self._need_torch("pin_memory")
        return self._like({k: v.pin_memory(*args) for k, v in self.items()})

    def _need_torch(self, method: str) -> None:
        """Refuses a torch method on a batch of NumPy arrays (``format="numpy"``, or no torch
        installed), saying so, rather than an AttributeError of ``numpy.ndarray``."""
        if any(isinstance(v, np.ndarray) for v in self.values()):
            hint = ("install PyTorch (pip install torch) and load with format='torch'"
                    if _torch() is None else "load with format='torch'")
            raise OptionsError(f"Batch.{method}() moves torch tensors, and this batch holds "
                               f"NumPy arrays: {hint}", option="format")

    def __reduce__(self):
        return (Batch, (dict(self), self.epoch, self.step, self.seq_len, self.valid, self._pack))
