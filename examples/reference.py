"""The reference tasks, networks and input normalisation on a dsc cache: what
``examples/train.py`` trains (and ``scripts/bench_gpu.py`` and ``scripts/bench_learning.py``
measure), in plain ``torch.nn``, the same as dsc-train's (trainer/). Copy what you need.

Tasks (what is learned from the cache's targets tensor ``y``):

- ``direction``: ``y`` holds azimuth and zenith in radians (IceCube); the network predicts a 3-D
  vector, the loss is ``1 - cos`` to the true unit vector, the metric the mean angular error in
  radians (lower is better; predicting nothing useful gives about 1.57).
- ``classification``: one integer column of ``y`` (``--target NAME``, classes ``0..K-1`` with
  ``K`` = the training split's maximum + 1); cross-entropy, metric accuracy.
- ``regression``: mean squared error on the target columns standardised with the training
  split's statistics; metric the mean absolute error in stored units.

Models: ``transformer`` (pre-norm encoder built from ``scaled_dot_product_attention`` with the
padding mask from ``length``, learned positions, masked mean pooling) and ``gru`` (read at the
last stored step of each sequence). Both embed the per-step features ``x`` with a linear
projection and add one ``nn.Embedding`` per categorical tensor (code 0, null and padding, has a
zero embedding); per-context features ``c`` join the pooled vector before the head.

Input normalisation (``--no-normalise`` switches it off). dsc stores feature columns as the
``--encode`` chain made them: a ``zscore`` or ``minmax`` column is already on a unit scale, a
``bool`` is 0/1, but an ``identity`` column is in source units (IceCube's x, y, z are metres,
about +-500, which saturate a freshly initialised network) and a ``log1p`` column is only
compressed. For those, the model subtracts a shift and divides by a scale taken from the cache's
own ``stats.json``, train split (never validation data):

- ``identity`` columns: the column's ``mean`` and ``std``.
- other chains (e.g. ``log1p``): stats.json describes the values *before* encoding, and means do
  not pass through a non-linear map, but quantiles pass through any increasing one. So the shift
  is the encoded median and the scale the encoded inter-quartile range / 1.349 (the IQR of a
  unit normal), both computed by pushing the stored quantiles through the encoding chain.

The shift and scale are buffers of the model, so they are saved in checkpoints and the trained
model carries its own preprocessing.

Packed batches (``--pack T``). Instead of padded batches of ``--batch-size`` contexts, each step
trains one pack: whole sequences laid end to end in ``T`` tokens (``dsc.Loader(pack=T)``), so
every step has the same shapes and almost no padding. The networks read the per-step tensors
as ``[T, ...]`` and keep each sequence to itself: attention runs per sequence
(``torch.nn.attention.varlen.varlen_attn`` over ``cu_seqlens`` on CUDA; elsewhere, and with
dropout, the packed tokens are scattered into a ``[S, L]`` view and attend with the same
padding mask as padded batches, which keeps memory linear in ``T``: a dense ``[T, T]`` mask
would not be); the GRU runs over the same view; pooling sums each sequence's tokens with
``index_add_`` over ``seq_idx``. The loss is the mean over the pack's sequences (masked by
``num_seqs``), so a step's weight is per context, as with padded batches; a pack holds a
varying number of contexts (about ``T`` / mean length; choose ``T`` near ``--batch-size`` x
the mean stored length to keep the steps per epoch). With ``--compile`` the step is compiled
once for the pack's static shapes (``dynamic=False``) and, on CUDA, captured as CUDA graphs
(``mode="reduce-overhead"``), beside fused AdamW.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import dsc

# A pack's own tensors, beside the stored ones (dsc.Loader(pack=T)), as the loader names them.
PACK_TENSORS = list(dsc.Loader.PACK_TENSORS)


# --------------------------------------------------------------------------------------------
# What the cache holds: inputs, normalisation, task
# --------------------------------------------------------------------------------------------

def train_column_stats(cache: dsc.Cache) -> Dict[Tuple[str, str], Dict[str, Any]]:
    """The train split's ColumnStats keyed by (role, column name).

    stats.json lists columns in a fixed order (features, categorical, targets, context
    features: FORMAT.md section 9), so walking the schema in that order pairs them up even when
    two roles share a column name.
    """
    split = next((s for s in cache.stats["splits"] if s["split"] == "train"), None)
    if split is None:  # a cache without a train split: fall back to all contexts
        split = cache.stats["splits"][0]
    expected = [(t.role, c) for role in ("features", "categorical", "targets", "context_features")
                for t in cache.schema if t.role == role for c in t.columns]
    columns = split["columns"]
    if [c["name"] for c in columns] == [name for _, name in expected]:
        return {key: col for key, col in zip(expected, columns)}
    # An unexpected layout: match by name and source table (a context column may share its
    # name with a rows column); per-step roles read rows or join tables, the others context.
    by_table = {(col["name"], col["table"]): col for col in columns}
    out = {}
    for role, name in expected:
        tables = ("context",) if role in ("targets", "context_features") else ("rows", "join")
        col = next((by_table[(name, t)] for t in tables if (name, t) in by_table), None)
        if col is not None:
            out[(role, name)] = col
    return out


def _encode(stages: Sequence[Dict[str, Any]], v: float) -> float:
    """Applies an encoding chain to one source value (as the compiler did)."""
    for st in stages:
        op = st["op"]
        if op == "log1p":
            v = math.log1p(v)
        elif op == "zscore":
            v = (v - st["mean"]) / st["std"] if st["std"] else v - st["mean"]
        elif op == "minmax":
            span = st["max"] - st["min"]
            v = (v - st["min"]) / span if span else v - st["min"]
        elif op != "identity":
            raise ValueError(f"unknown encoding stage {op!r}")
    return v


def column_normalisation(encoding: Dict[str, Any],
                         stats: Optional[Dict[str, Any]]) -> Tuple[float, float]:
    """(shift, scale) for one stored column: identity when the encoding is already on a unit
    scale; see the module docstring for the rule."""
    if encoding.get("kind") != "numeric" or not stats or not stats.get("numeric"):
        return 0.0, 1.0
    stages = encoding.get("stages", [])
    if stages and stages[-1]["op"] in ("zscore", "minmax"):
        return 0.0, 1.0
    num = stats["numeric"]
    if all(st["op"] == "identity" for st in stages):
        shift, scale = num["mean"], num["std"]
    else:
        q = {round(x["q"], 2): x["value"] for x in num.get("quantiles", [])}
        if not all(k in q for k in (0.25, 0.5, 0.75)):
            return 0.0, 1.0
        try:
            lo, mid, hi = (_encode(stages, q[k]) for k in (0.25, 0.5, 0.75))
        except (ValueError, OverflowError):  # e.g. log1p of a value <= -1
            return 0.0, 1.0
        shift, scale = mid, (hi - lo) / 1.349
        if not scale > 0 and 0.01 in q and 0.99 in q:  # a spike at the median: use the tails
            try:
                scale = (_encode(stages, q[0.99]) - _encode(stages, q[0.01])) / 4.653
            except (ValueError, OverflowError):
                return 0.0, 1.0
    if not (math.isfinite(shift) and math.isfinite(scale) and scale > 0):
        return 0.0, 1.0
    return float(shift), float(scale)


@dataclass
class Inputs:
    """Which tensors of a batch the network reads, and their sizes."""

    x: Optional[str]                 # per-step features [B, S, F]
    features: int
    categorical: List[str]           # per-step codes [B, S] each
    vocabularies: List[int]          # codes per categorical: null, unknown, vocabulary
    context: Optional[str]           # per-context features [B, C]
    context_features: int
    x_norm: Tuple[List[float], List[float]]
    c_norm: Tuple[List[float], List[float]]
    max_len: int

    @property
    def names(self) -> List[str]:
        return [n for n in [self.x, *self.categorical, self.context, "length"] if n]


def resolve_inputs(cache: dsc.Cache, normalise: bool) -> Inputs:
    stats = train_column_stats(cache) if normalise else {}

    def norm(t: Optional[dsc.TensorInfo]) -> Tuple[List[float], List[float]]:
        if t is None:
            return [], []
        pairs = [column_normalisation(enc, stats.get((t.role, c))) if normalise else (0.0, 1.0)
                 for c, enc in zip(t.columns, t.encodings)]
        return [s for s, _ in pairs], [k for _, k in pairs]

    by_role = lambda role: [t for t in cache.schema if t.role == role]  # noqa: E731
    x = next(iter(by_role("features")), None)
    c = next(iter(by_role("context_features")), None)
    cats = by_role("categorical")
    if x is None and not cats:
        raise SystemExit(f"{cache.path}: no per-step tensor (features or categorical) to train on")
    return Inputs(
        x=x.name if x else None,
        features=x.shape[-1] if x else 0,
        categorical=[t.name for t in cats],
        # The reserved codes 0 (null / padding) and 1 (unknown) come before the vocabulary.
        vocabularies=[cache.vocab_size(t.name) for t in cats],
        context=c.name if c else None,
        context_features=c.shape[0] if c else 0,
        x_norm=norm(x),
        c_norm=norm(c),
        max_len=cache.max_len,
    )


class Task(nn.Module):
    """The loss and the validation metric on the selected columns of ``y`` (a module so that
    its index and scaling tensors follow the model to the device)."""

    def __init__(self, kind: str, columns: List[int], names: List[str], outputs: int,
                 shift: Optional[List[float]] = None, scale: Optional[List[float]] = None):
        super().__init__()
        self.kind, self.names, self.outputs = kind, names, outputs
        self.metric = {"direction": "mean_angular_error_rad", "classification": "accuracy",
                       "regression": "mae"}[kind]
        self.register_buffer("index", torch.tensor(columns, dtype=torch.long), persistent=False)
        n = len(columns)
        self.register_buffer("shift", torch.tensor(shift or [0.0] * n), persistent=False)
        self.register_buffer("scale", torch.tensor(scale or [1.0] * n), persistent=False)

    def forward(self, pred: torch.Tensor, y: torch.Tensor, metric: bool = False):
        """Per-sample loss [B] (and metric [B] when asked), in float32 whatever autocast did."""
        pred, t = pred.float(), y.index_select(1, self.index)
        if self.kind == "direction":
            az, zen = t[:, 0], t[:, 1]
            unit = torch.stack([az.cos() * zen.sin(), az.sin() * zen.sin(), zen.cos()], 1)
            cos = (F.normalize(pred, dim=1, eps=1e-6) * unit).sum(1)
            angle = cos.clamp(-1 + 1e-7, 1 - 1e-7).acos() if metric else None
            return 1 - cos, angle
        if self.kind == "classification":
            cls = t[:, 0].long()
            loss = F.cross_entropy(pred, cls, reduction="none")
            return loss, (pred.argmax(1) == cls).float() if metric else None
        z = (t - self.shift) / self.scale  # regression on standardised targets
        loss = (pred - z).square().mean(1)
        mae = ((pred * self.scale + self.shift) - t).abs().mean(1) if metric else None
        return loss, mae


def resolve_task(cache: dsc.Cache, kind: str, target: Optional[str]) -> Task:
    y = next((t for t in cache.schema if t.role == "targets"), None)
    if y is None:
        raise SystemExit(f"{cache.path}: the cache has no targets tensor y "
                         "(compile it with --targets)")
    names = list(y.columns)
    if target:
        wanted = target.split(",")
    elif kind == "direction":
        wanted = ["azimuth", "zenith"]
    elif kind == "regression" or len(names) == 1:
        wanted = names
    else:
        raise SystemExit(f"y has columns {names}; name the class column with --target")
    missing = [w for w in wanted if w not in names]
    if missing:
        raise SystemExit(f"no target column {missing[0]!r} in y (columns: {names})")
    cols = [names.index(w) for w in wanted]
    if kind == "direction":
        if len(cols) != 2:
            raise SystemExit("--task direction takes two target columns (azimuth, zenith), "
                             f"got {wanted}")
        for i in cols:
            enc = y.encodings[i]
            if enc.get("kind") != "numeric" or any(s["op"] != "identity" for s in enc["stages"]):
                raise SystemExit(f"--task direction needs {names[i]} in radians as stored; "
                                 f"compile it with --encode {names[i]}=identity")
        return Task(kind, cols, wanted, 3)
    if kind == "classification":
        if len(cols) != 1:
            raise SystemExit(f"--task classification takes one target column, got {wanted}")
        return Task(kind, cols, wanted, count_classes(cache, y.name, cols[0], wanted[0]))
    stats = train_column_stats(cache)
    norms = [column_normalisation(y.encodings[i], stats.get(("targets", names[i]))) for i in cols]
    return Task(kind, cols, wanted, len(cols), [s for s, _ in norms], [k for _, k in norms])


def count_classes(cache: dsc.Cache, y_name: str, column: int, name: str) -> int:
    """K = the training split's largest class + 1, checking every value is a class number.

    stats.json has the column's max but cannot prove every value is an integer, so this reads
    the targets of the train split once (the ``columns`` option loads ``y`` alone: fast).
    """
    # The whole split on every rank (rank=0, world_size=1): each needs the same K.
    loader = dsc.Loader(cache, split="train", batch_size=4096, shuffle=False, drop_last=False,
                        columns=[y_name], rank=0, world_size=1)
    top = -1
    for batch in loader:
        # drop_last=False completes the last batch with the epoch's first contexts: skip those.
        v = batch[y_name][: batch.valid, column]
        bad = (v < 0) | (v != v.floor()) | ~torch.isfinite(v)
        if bad.any():
            raise SystemExit(f"--task classification: target {name!r} holds "
                             f"{v[bad][0].item()}, not a class number 0, 1, 2, ...")
        top = max(top, int(v.max().item()))
    if top < 1:
        raise SystemExit(f"--task classification: {name!r} has a single class in the train split")
    return top + 1


# --------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------

def step_mask(length: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, S] True at stored steps. A context with no stored step keeps step 0 so that attention
    and pooling never see an empty set (which would give NaN)."""
    return torch.arange(steps, device=length.device) < length.clamp(min=1).unsqueeze(1)


def is_packed(batch: Dict[str, torch.Tensor]) -> bool:
    return "cu_seqlens" in batch


def varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


class PackedView:
    """How one packed batch's tokens (``[T, ...]``) map to its sequences: the ``[S, L]`` view
    (sequence ``seq_idx``, step ``position``) that keeps each sequence to itself.

    Scattering into the view and gathering back are one index each; the unused tail of the
    pack (``seq_idx == S``) goes to a spare row that is dropped, and comes back as zeros."""

    def __init__(self, batch: Dict[str, torch.Tensor], max_len: int, attention: str):
        self.seq = batch["seq_idx"].long()                     # [T], S for the unused tail
        self.length = batch["length"]                          # [S] (0 for unused rows)
        self.seqs, self.max_len = self.length.shape[0], max_len
        self.tokens = self.seq.shape[0]
        spare = self.seqs * max_len
        self.index = torch.where(self.seq < self.seqs, self.seq * max_len + batch["position"].long(),
                                 torch.full_like(self.seq, spare))
        self.mask = step_mask(self.length, max_len)            # [S, L]
        self.attention = attention
        if attention == "varlen":
            # varlen_attn writes only tokens inside a segment, and garbage in the tail would
            # reach the weight gradients as NaN: cover the tail with segments of at most L
            # tokens (max_seqlen stays L; the tail's values are zeros, so its outputs are finite).
            tail = batch["num_tokens"].to(torch.int32) + max_len * torch.arange(
                1, -(-self.tokens // max_len) + 1, device=self.seq.device, dtype=torch.int32)
            self.cu = torch.cat([batch["cu_seqlens"], tail.clamp(max=self.tokens)])

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """[T, ...] tokens to the [S, L, ...] view (zeros where no token is)."""
        out = x.new_zeros((self.seqs * self.max_len + 1, *x.shape[1:]))
        out = out.index_copy(0, self.index, x)
        return out[:-1].view(self.seqs, self.max_len, *x.shape[1:])

    def gather(self, v: torch.Tensor) -> torch.Tensor:
        """The [S, L, ...] view back to [T, ...] tokens (the tail gets zeros)."""
        flat = v.reshape(self.seqs * self.max_len, *v.shape[2:])
        flat = torch.cat([flat, flat.new_zeros((1, *flat.shape[1:]))])
        return flat.index_select(0, self.index)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               dropout: float) -> torch.Tensor:
        """Attention of each token to the tokens of its own sequence; q, k, v [T, heads, dh]."""
        if self.attention == "varlen" and dropout == 0.0:
            from torch.nn.attention.varlen import varlen_attn
            return varlen_attn(q, k, v, self.cu, self.cu, self.max_len, self.max_len)
        # [S, heads, L, dh] with the padding mask of padded batches.
        qs, ks, vs = (self.scatter(t).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=self.mask[:, None, None, :],
                                           dropout_p=dropout)
        return self.gather(a.transpose(1, 2))

    def pool(self, h: torch.Tensor) -> torch.Tensor:
        """Mean over each sequence's tokens: [T, D] to [S, D] (float32 sums)."""
        sums = h.new_zeros((self.seqs + 1, h.shape[-1]), dtype=torch.float32)
        sums = sums.index_add(0, self.seq, h.float())[: self.seqs]
        return sums / self.length.clamp(min=1).unsqueeze(1).float()


class Embed(nn.Module):
    """Per-step inputs to [B, S, dim] (a pack's to [T, dim]): normalised features projected,
    plus one embedding per categorical tensor."""

    def __init__(self, inp: Inputs, dim: int):
        super().__init__()
        self.inp = inp
        self.proj = nn.Linear(inp.features, dim) if inp.x else None
        self.register_buffer("x_shift", torch.tensor(inp.x_norm[0]).view(1, 1, -1))
        self.register_buffer("x_scale", torch.tensor(inp.x_norm[1]).view(1, 1, -1))
        # padding_idx=0: null and padding steps contribute nothing and get no gradient.
        self.cats = nn.ModuleList(nn.Embedding(v, dim, padding_idx=0) for v in inp.vocabularies)
        for emb in self.cats:
            # nn.Embedding starts at N(0, 1): thousands of random unit vectors (one per sensor,
            # say) would drown the projected features, and rare codes never learn them away.
            # Start small, as the positions do, and let training grow what is useful.
            nn.init.normal_(emb.weight, std=0.02)
            with torch.no_grad():
                emb.weight[0].zero_()

    def forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        h = None
        if self.proj is not None:
            # The buffers are [1, 1, F] (as checkpoints hold them); [F] fits [B, S, F] and [T, F].
            x = (batch[self.inp.x] - self.x_shift.view(-1)) / self.x_scale.view(-1)
            h = self.proj(x)
        for name, emb in zip(self.inp.categorical, self.cats):
            e = emb(batch[name])  # int32 codes index directly
            h = e if h is None else h + e
        return h


class Head(nn.Module):
    """Pooled sequence (+ normalised per-context features) to the outputs."""

    def __init__(self, inp: Inputs, dim: int, outputs: int):
        super().__init__()
        self.inp = inp
        self.register_buffer("c_shift", torch.tensor(inp.c_norm[0]).view(1, -1))
        self.register_buffer("c_scale", torch.tensor(inp.c_norm[1]).view(1, -1))
        self.net = nn.Sequential(nn.Linear(dim + inp.context_features, dim), nn.GELU(),
                                 nn.Linear(dim, outputs))

    def forward(self, pooled: torch.Tensor, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        if self.inp.context:
            c = (batch[self.inp.context] - self.c_shift) / self.c_scale
            pooled = torch.cat([pooled, c.to(pooled.dtype)], 1)
        return self.net(pooled)


class Block(nn.Module):
    """Pre-norm encoder layer: h + attn(norm(h)), then h + mlp(norm(h))."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        b, s, d = h.shape
        qkv = self.qkv(self.norm1(h)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, heads, S, d/heads]
        # attn_mask [B, 1, 1, S]: every query attends to the stored steps only.
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        h = h + self.drop(self.proj(a.transpose(1, 2).reshape(b, s, d)))
        return h + self.drop(self.mlp(self.norm2(h)))

    def forward_packed(self, h: torch.Tensor, view: PackedView) -> torch.Tensor:
        """The same layer on a pack's tokens [T, D]: every product but attention runs on the
        tokens alone, none on padding."""
        t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(t, 3, self.heads, d // self.heads).unbind(1)
        a = view.attend(q, k, v, self.dropout if self.training else 0.0)
        h = h + self.drop(self.proj(a.reshape(t, d)))
        return h + self.drop(self.mlp(self.norm2(h)))


class Transformer(nn.Module):
    def __init__(self, inp: Inputs, dim: int, layers: int, heads: int, dropout: float,
                 outputs: int, attention: str = "padded"):
        super().__init__()
        self.embed = Embed(inp, dim)
        self.positions = nn.Parameter(torch.randn(inp.max_len, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = Head(inp, dim, outputs)
        self.max_len, self.attention = inp.max_len, attention

    def forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        if is_packed(batch):
            return self.forward_packed(batch)
        h = self.embed(batch)
        s = h.shape[1]  # trimmed batches have S <= L
        h = h + self.positions[:s]
        mask = step_mask(batch["length"], s)
        attn_mask = mask[:, None, None, :]
        for blk in self.blocks:
            h = blk(h, attn_mask)
        h = self.norm(h)
        # Masked mean over the stored steps (float32 sums even under autocast).
        w = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * w).sum(1, dtype=torch.float32) / w.sum(1, dtype=torch.float32)
        return self.head(pooled.to(h.dtype), batch)

    def forward_packed(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """[S, outputs] for a pack: rows past ``num_seqs`` are unused (their inputs are
        zeros)."""
        view = PackedView(batch, self.max_len, self.attention)
        h = self.embed(batch) + self.positions[batch["position"].long()]
        for blk in self.blocks:
            h = blk.forward_packed(h, view)
        h = self.norm(h)
        return self.head(view.pool(h).to(h.dtype), batch)


class GRU(nn.Module):
    def __init__(self, inp: Inputs, dim: int, layers: int, dropout: float, outputs: int):
        super().__init__()
        self.embed = Embed(inp, dim)
        self.gru = nn.GRU(dim, dim, num_layers=layers, batch_first=True,
                          dropout=dropout if layers > 1 else 0.0)
        self.head = Head(inp, dim, outputs)
        self.max_len = inp.max_len

    def forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        h = self.embed(batch)
        if is_packed(batch):
            # The pack's sequences as a [S, L] view; the GRU reads it as it reads a padded batch.
            h = PackedView(batch, self.max_len, "padded").scatter(h)
        # The recurrence runs in float32 whatever --amp says (as in dsc-train): errors would
        # compound over up to L steps, and the GRU is a small share of the work.
        with torch.autocast(h.device.type, enabled=False):
            out, _ = self.gru(h.float())
        # A forward GRU's output at step t ignores later (padding) steps, so reading it at the
        # last stored step is exact without pack_padded_sequence, which would need the lengths
        # on the host (a device sync every step).
        last = (batch["length"].long() - 1).clamp(min=0)
        pooled = out.gather(1, last.view(-1, 1, 1).expand(-1, 1, out.shape[-1])).squeeze(1)
        return self.head(pooled, batch)


def attention_kind(args: argparse.Namespace, device: torch.device, amp: str) -> str:
    """``varlen`` or ``padded``: how packed batches attend (see the module docstring)."""
    choice = getattr(args, "attention", None) or "auto"
    runs = device.type == "cuda" and amp in ("bf16", "fp16") and varlen_available()
    if choice == "varlen" and not runs:
        raise SystemExit("--attention varlen needs CUDA, --amp bf16 or fp16 and "
                         "torch.nn.attention.varlen (PyTorch 2.9 or later)")
    if choice == "auto":
        return "varlen" if runs else "padded"
    return choice


def build_model(args: argparse.Namespace, inp: Inputs, outputs: int,
                attention: str = "padded") -> nn.Module:
    if args.model == "transformer":
        if args.dim % args.heads:
            raise SystemExit(f"--dim {args.dim} is not a multiple of --heads {args.heads}")
        return Transformer(inp, args.dim, args.layers, args.heads, args.dropout, outputs,
                           attention)
    return GRU(inp, args.dim, args.layers, args.dropout, outputs)


# --------------------------------------------------------------------------------------------
# Optimisation
# --------------------------------------------------------------------------------------------

def lr_factor(step: int, warmup: int, total: int) -> float:
    """Multiplier of the peak rate before optimizer step ``step`` (0-based): linear warmup, then
    a cosine decay to a tenth of the peak (dsc-train's schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, args: argparse.Namespace, device: torch.device,
                    graph: bool = False):
    # Decay matrices (linear weights, embeddings, positions), not biases and norm gains.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    if graph:
        # A captured step: the learning rate is one device tensor that both groups share and the
        # step rewrites in place; fused AdamW takes it (on the CPU too), and on CUDA keeps its
        # step counts on the device (capturable).
        lr = torch.tensor(args.lr, dtype=torch.float32, device=device)
        return torch.optim.AdamW(groups, lr=lr, fused=True, capturable=device.type == "cuda")
    # fused AdamW is one kernel per step on CUDA; the CPU keeps the default implementation.
    return torch.optim.AdamW(groups, lr=args.lr, fused=device.type == "cuda")


def mean_loss(task: Task, pred: torch.Tensor, b: Dict[str, torch.Tensor]) -> torch.Tensor:
    """The mean loss over the batch's contexts: for a pack, over its ``num_seqs`` leading rows
    (the rest are unused), so that a step weighs each context as a padded batch does."""
    per = task(pred, b["y"])[0]
    if not is_packed(b):
        return per.mean()
    n = b["num_seqs"].squeeze(0)
    used = torch.arange(per.shape[0], device=per.device) < n
    return torch.where(used, per, 0.0).sum() / n.clamp(min=1)
