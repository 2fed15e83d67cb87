"""The whole training step as CUDA graphs (:class:`CapturedStep`): a user's model, loss and
optimizer fed from a ``dsc.Loader(static=True)``, captured once and replayed every step.

A small network's step on a GPU is a few hundred kernels of microseconds each, and the host
launching them one by one sets its pace. Captured, the same kernels replay with one launch. A
replay repeats the captured work on the captured addresses, so everything the step reads from
outside must be rewritten in place before each replay (the batch: the loader's static buffers;
the learning rate: a device table indexed by a device step counter) and nothing in the step may
wait for the host or branch on data. This module holds those rules in one place so that a
user's loop does not have to: on the CPU (and before capture) the same functions run eagerly,
so a CPU test of a loop is a test of what the GPU will replay.
"""

from __future__ import annotations

import math
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional

from ._errors import Error, OptionsError

# Optimizer steps run eagerly before capture: lazily made state (moments, cuBLAS workspaces)
# must exist before the graph records addresses. DDP builds its buckets in the first steps and
# wants at least 11 (PyTorch's CUDA graphs notes).
WARMUP = 3
DDP_WARMUP = 11

# Operators that make the host wait for the device or give outputs whose shape depends on
# values: a graph can record neither.
_HOST_SYNCS = {
    "_local_scalar_dense": ".item(), float(), int(), bool() or an `if` on a tensor",
    "nonzero": "nonzero(), a boolean mask index or torch.where with one argument",
    "masked_select": "a boolean mask index (x[mask])",
    "index": "a boolean mask index (x[mask])",
    "index_put": "an assignment through a boolean mask (x[mask] = v)",
    "index_put_": "an assignment through a boolean mask (x[mask] = v)",
    "unique": "torch.unique",
    "_unique2": "torch.unique",
    "unique_consecutive": "torch.unique_consecutive",
    "repeat_interleave": "repeat_interleave without output_size",
    "equal": "torch.equal",
    "allclose": "torch.allclose",
    "bincount": "torch.bincount",
    "histc": "torch.histc",
    "histogram": "torch.histogram",
}


class CaptureError(Error):
    """A training step that cannot run as a CUDA graph: what in it cannot, and what to
    change."""


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - the package installs without torch
        raise Error("dsc.CapturedStep needs PyTorch (pip install torch)") from e
    return torch


class CapturedStep:
    """One training micro-step (the batch's gather, ``loss_fn``, backward, and after every
    ``accumulate`` micro-steps clipping, the learning rate and the optimizer's update) captured
    as CUDA graphs and replayed. Call it after each ``next()`` of the loader::

        step = dsc.CapturedStep(model, loss_fn, optimizer, loader, clip=1.0,
                                schedule=lambda s: min(1.0, (s + 1) / 100), steps=total)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for _ in loader:
                step()
            print(step.loss())

    model: the network (a ``DistributedDataParallel`` one too: build DDP on a side stream);
    loss_fn: ``loss_fn(model, batch) -> scalar tensor``, the batch a dict of the loader's static
    tensors; optimizer: one whose update can be captured (Adam, AdamW and the others with a
    ``capturable`` option, which is set; or SGD); loader: a ``dsc.Loader(static=True)`` on the
    model's device (with ``gather_in_step=True`` the step gathers the batch itself).

    accumulate: micro-steps per optimizer step (the loss is divided by it, so the summed
    gradients are those of the mean loss); clip: the global gradient norm to clip to (0: off);
    schedule: the learning rate per optimizer step, as a factor of each group's rate
    (``lambda step: ...``, as ``LambdaLR``) or a ``torch.optim.lr_scheduler`` scheduler from
    where it stands (do not step it yourself); either becomes a table of ``steps`` rates on the
    device (past its end the last rate holds); autocast: the dtype of mixed precision
    (``torch.bfloat16``) or None; capture: False runs every step eagerly, also on CUDA (to
    debug); warmup: eager optimizer steps before capture.

    On CUDA the first ``warmup`` optimizer steps run eagerly on a side stream (they are real
    training steps), then the step is captured (one graph, or two with ``accumulate``: the
    micro-step and the update) and every later call is one replay. On the CPU the same functions
    run eagerly: the weights are those of the plain loop (within float32 rounding of the
    learning rate). The running loss stays on the device until :meth:`loss` reads it.
    """

    def __init__(self, model: Any, loss_fn: Callable[[Any, Dict[str, Any]], Any],
                 optimizer: Any, loader: Any, *, accumulate: int = 1, clip: float = 0.0,
                 schedule: Any = None, steps: Optional[int] = None, autocast: Any = None,
                 capture: bool = True, warmup: Optional[int] = None) -> None:
        torch = self.torch = _torch()
        self.model, self.loss_fn, self.optimizer, self.loader = model, loss_fn, optimizer, loader
        self.accumulate = _count("accumulate", accumulate, low=1)
        self.clip = _number("clip", clip)
        if not getattr(loader, "static", False):
            raise OptionsError(
                "dsc.CapturedStep replays every batch on the same addresses: build the loader "
                "with static=True (padded batches with trim=False, or pack=); batches that "
                "change shape cannot be captured", option="loader")
        if getattr(loader, "drop_last", True) is False:
            raise OptionsError(
                "drop_last=False completes the last batch with filler rows (batch.valid says "
                "how many are real, on the host), which a replayed step would train on: use "
                "drop_last=True for training", option="loader")
        self.device = torch.device(loader.static_batch[next(iter(loader.static_batch))].device)
        self.cuda = self.device.type == "cuda"
        self.autocast_dtype = _autocast_dtype(torch, autocast)
        self.params = [p for g in optimizer.param_groups for p in g["params"]
                       if p.requires_grad]
        ddp = type(model).__name__ == "DistributedDataParallel"
        # What a graph cannot record is refused on every device, so that a loop tested on the
        # CPU runs on a GPU as it is.
        self.checks = bool(capture)
        self.capture_wanted = self.checks and self.cuda
        if self.checks:
            _capturable(optimizer, set_it=False)
            if (schedule is not None and isinstance(optimizer, torch.optim.SGD)
                    and not optimizer.defaults.get("fused")):
                raise OptionsError(
                    "SGD with a schedule reads its tensor learning rate back on every update "
                    "unless fused: make it torch.optim.SGD(..., fused=True)", option="optimizer")
        for i, group in enumerate(optimizer.param_groups):
            rate = float(group["lr"])
            if not math.isfinite(rate) or rate < 0:
                raise OptionsError(f"the optimizer's group {i} has learning rate {rate}: a "
                                   "captured step trains with it on every replay; expected zero "
                                   "or a positive number", option="optimizer")
        self.rates, self.table_start = _rate_table(torch, optimizer, schedule, steps,
                                                   self.device)
        self.host_rates = None if self.rates is None else self.rates.cpu().tolist()
        self.bound: Optional[List[Any]] = None
        # A scheduler that has run already stands at its step: the count starts there
        # (load_state_dict sets it for a resume).
        self.optimizer_steps = self.table_start
        self.micro_steps = self.table_start * self.accumulate
        self.step_counter = torch.full((), self.table_start, dtype=torch.long,
                                       device=self.device)
        self.loss_sum = torch.zeros((), device=self.device)
        self.loss_count = 0
        default = DDP_WARMUP if ddp else WARMUP
        self.warmup_left = _count("warmup", default if warmup is None else warmup, low=1)
        self.graphs: Optional[tuple] = None
        self.side = torch.cuda.Stream(self.device) if self.capture_wanted else None
        self.checked = False

    # ---- the step's device work --------------------------------------------------------------

    def _micro(self) -> None:
        torch = self.torch
        batch = (self.loader.gather() if getattr(self.loader, "gather_in_step", False)
                 else dict(self.loader.static_batch))
        with torch.autocast(self.device.type, dtype=self.autocast_dtype,
                            enabled=self.autocast_dtype is not None, cache_enabled=False):
            loss = self.loss_fn(self.model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise CaptureError(f"loss_fn returned {type(loss).__name__}"
                               f"{'' if not isinstance(loss, torch.Tensor) else list(loss.shape)}"
                               ": CapturedStep needs one scalar tensor")
        (loss.float() / self.accumulate).backward()
        self.loss_sum += loss.detach().float().reshape(())

    def _update(self) -> None:
        torch = self.torch
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip, foreach=True)
        if self.rates is not None:
            at = (self.step_counter - self.table_start).clamp(0, self.rates.shape[0] - 1)
            row = self.rates.index_select(0, at.view(1)).squeeze(0)
            for i, group in enumerate(self.optimizer.param_groups):
                group["lr"].copy_(row[i])
        self.optimizer.step()
        # Zeroed in place: the gradients keep the addresses the graph recorded.
        self.optimizer.zero_grad(set_to_none=False)
        self.step_counter += 1

    def _bind(self) -> None:
        """Readies the optimizer at the first call, after any state the user loaded into it:
        ``capturable`` on CUDA (its step counts on the device) and, with a schedule, each
        group's rate a device tensor that the update rewrites in place."""
        if self.capture_wanted:
            _capturable(self.optimizer, set_it=True)
        if self.rates is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.torch.zeros((), dtype=self.torch.float32, device=self.device)
        self.bound = [g["lr"] for g in self.optimizer.param_groups]

    def _eager(self, last: bool) -> None:
        if self.checks and not self.checked:
            _without_host_syncs(self.torch, self._micro)
            self.checked = True
        else:
            self._micro()
        if last:
            self._update()

    # ---- what the user calls -----------------------------------------------------------------

    def __call__(self) -> bool:
        """One micro-step on the batch the loader's last ``next()`` placed. Returns whether it
        ended an optimizer step."""
        if self.bound is None:
            self._bind()
        elif any(g["lr"] is not lr for g, lr in zip(self.optimizer.param_groups, self.bound)):
            raise CaptureError(
                "the optimizer's state was loaded after the step's first call: its groups no "
                "longer hold the rates the step writes (nor, once captured, what the graph "
                "reads); load the optimizer's state before the first call")
        self.micro_steps += 1
        self.loss_count += 1
        last = self.micro_steps % self.accumulate == 0
        if self.graphs is None and self.capture_wanted and self.warmup_left == 0:
            self.graphs = self._capture()
        if self.graphs is not None:
            micro, update = self.graphs
            micro.replay()
            if last and update is not None:
                update.replay()
        elif self.capture_wanted:
            # Warm-up on a side stream, as capture wants; it waits for the batch's copy.
            torch = self.torch
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side):
                self._eager(last)
            torch.cuda.current_stream(self.device).wait_stream(self.side)
        else:
            self._eager(last)
        if last:
            self.optimizer_steps += 1
            if self.warmup_left:
                self.warmup_left -= 1
        return last

    def _capture(self) -> tuple:
        torch = self.torch
        try:
            # thread_local: the loader's threads wait on their copies' events meanwhile, which
            # a global capture would take for unsafe calls into the stream.
            micro = torch.cuda.CUDAGraph()
            with torch.cuda.graph(micro, capture_error_mode="thread_local"):
                self._micro()
                if self.accumulate == 1:
                    self._update()
            if self.accumulate == 1:
                return micro, None
            update = torch.cuda.CUDAGraph()
            with torch.cuda.graph(update, capture_error_mode="thread_local"):
                self._update()
            return micro, update
        except RuntimeError as e:
            raise CaptureError(f"capturing the training step as a CUDA graph failed ({e}); "
                               "run it with capture=False to find the operation") from e

    @property
    def captured(self) -> bool:
        """Whether the step now replays CUDA graphs."""
        return self.graphs is not None

    def loss(self) -> float:
        """The mean loss of the micro-steps since the last call (one read-back), or NaN when
        there were none."""
        if self.loss_count == 0:
            return math.nan
        value = float(self.loss_sum) / self.loss_count
        self.loss_sum.zero_()
        self.loss_count = 0
        return value

    def lr(self) -> List[float]:
        """Each parameter group's learning rate for the next optimizer step (from the host's copy
        of the table: no read-back)."""
        if self.host_rates is None:
            return [float(g["lr"]) for g in self.optimizer.param_groups]
        at = min(max(self.optimizer_steps - self.table_start, 0), len(self.host_rates) - 1)
        return self.host_rates[at]

    def state_dict(self) -> Dict[str, Any]:
        """The position to save with a checkpoint (the model's and optimizer's states are
        theirs): optimizer steps taken, micro-steps into the next one and, between an optimizer
        step's micro-steps, the gradients summed so far (on the CPU)."""
        micro = self.micro_steps % self.accumulate
        state: Dict[str, Any] = dict(optimizer_steps=self.optimizer_steps, micro_steps=micro)
        if micro:
            state["grads"] = [None if p.grad is None else p.grad.detach().cpu().clone()
                              for p in self.params]
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from a saved position: the next update uses the schedule's rate of that
        optimizer step, and adds to the gradients the saved micro-steps summed."""
        steps = _count("optimizer_steps", state.get("optimizer_steps"), low=0)
        micro = _count("micro_steps", state.get("micro_steps", 0), low=0)
        if micro >= self.accumulate:
            raise OptionsError(f"micro_steps={micro}: a state of a step with accumulate above "
                               f"{self.accumulate}", option="micro_steps")
        grads = state.get("grads") if micro else None
        if micro and (grads is None or len(grads) != len(self.params)):
            raise OptionsError("a state saved between micro-steps carries their gradients, one "
                               f"per parameter ({len(self.params)} here)", option="grads")
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()  # in place: a captured graph holds these addresses
        for p, g in zip(self.params, grads or []):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g.to(p.device, p.dtype).clone()
            else:
                p.grad.copy_(g)
        self.optimizer_steps = steps
        self.micro_steps = steps * self.accumulate + micro
        self.step_counter.fill_(steps)


def _count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise OptionsError(f"{name}={value!r}: expected a whole number, at least {low}",
                           option=name)
    return value


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise OptionsError(f"{name}={value!r}: expected zero (off) or a positive number",
                           option=name)
    return float(value)


def _autocast_dtype(torch: Any, autocast: Any) -> Any:
    if autocast is None or autocast is False:
        return None
    if autocast is torch.float16:
        raise OptionsError(
            "autocast=torch.float16 needs a loss scaler, which reads every step's overflow "
            "back to the host: use torch.bfloat16 (same speed on GPUs that have it, no scaler)",
            option="autocast")
    if autocast is not torch.bfloat16:
        raise OptionsError(f"autocast={autocast!r}: expected torch.bfloat16 or None",
                           option="autocast")
    return autocast


def _capturable(optimizer: Any, set_it: bool) -> None:
    """Sets ``capturable`` where the optimizer has it and ``set_it`` (CUDA: its step counts then
    stay on the device); refuses one whose update reads back."""
    torch = _torch()
    name = type(optimizer).__name__
    if "capturable" in optimizer.defaults:
        if not set_it:
            return
        for group in optimizer.param_groups:
            group["capturable"] = True
        # A state loaded before: its step counts move to the parameters' device.
        for p, state in optimizer.state.items():
            step = state.get("step")
            if isinstance(step, torch.Tensor) and step.device != p.device:
                state["step"] = step.to(p.device, torch.float32)
        return
    if isinstance(optimizer, torch.optim.SGD):
        return
    raise OptionsError(
        f"{name} cannot run inside a CUDA graph (it has no `capturable` option: its update "
        "keeps counts on the host or needs a closure); use Adam, AdamW or SGD, or "
        "capture=False", option="optimizer")


def _rate_table(torch: Any, optimizer: Any, schedule: Any, steps: Optional[int],
                device: Any) -> tuple:
    """The learning rate of each group at each optimizer step as a ``[steps, groups]`` device
    tensor, and the step its first row is for; ``(None, 0)`` without a schedule."""
    if schedule is None:
        return None, 0
    steps = _count("steps", steps, low=1) if steps is not None else None
    if steps is None:
        raise OptionsError("a schedule becomes a table of rates on the device: give steps= "
                           "(the run's optimizer steps)", option="steps")
    groups = optimizer.param_groups
    if isinstance(schedule, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise OptionsError("ReduceLROnPlateau decides from a metric read back during "
                           "training: a captured step cannot follow it", option="schedule")
    if isinstance(schedule, (torch.optim.lr_scheduler.LRScheduler,
                             torch.optim.lr_scheduler.ChainedScheduler)):
        rows, start = _read_ahead(schedule, groups, steps)
    elif callable(schedule):
        # The factor's base is kept in the groups (and so in the optimizer's state), as torch's
        # schedulers keep theirs: a resumed run scales the same rates.
        for g in groups:
            g.setdefault("initial_lr", float(g["lr"]))
        base = [float(g["initial_lr"]) for g in groups]
        rows = [[b * float(schedule(s)) for b in base] for s in range(steps)]
        start = 0
    else:
        raise OptionsError(f"schedule={schedule!r}: expected a function of the optimizer step "
                           "or a torch.optim.lr_scheduler scheduler", option="schedule")
    bad = next(((s, r) for s, row in enumerate(rows) for r in row
                if not math.isfinite(r) or r < 0), None)
    if bad is not None:
        raise OptionsError(f"schedule gives learning rate {bad[1]} at optimizer step "
                           f"{start + bad[0]}: expected zero or a positive number",
                           option="schedule")
    return torch.tensor(rows, dtype=torch.float32, device=device), start


def _read_ahead(schedule: Any, groups: List[Dict[str, Any]], steps: int) -> tuple:
    """A torch scheduler's rates for ``steps`` optimizer steps from where it stands, read by
    running it ahead on its own; the scheduler and the optimizer's groups are put back as they
    were. Refuses one that changes more than the rate (OneCycleLR's momentum cycling, which a
    table of rates cannot carry) or that runs out before ``steps``."""
    saved = schedule.state_dict()
    kept = [{k: v for k, v in g.items() if k != "params"} for g in groups]
    # A ChainedScheduler keeps no count of its own: its first scheduler's is the chain's.
    inner = getattr(schedule, "_schedulers", None) or [schedule]
    start = getattr(schedule, "last_epoch", getattr(inner[0], "last_epoch", 0))
    rows: List[List[float]] = []
    changed = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # stepping it without optimizer.step()
            for s in range(steps):
                rows.append([float(r) for r in schedule.get_last_lr()])
                if s + 1 < steps:
                    schedule.step()
                    changed = changed or next(
                        (k for g, k0 in zip(groups, kept) for k in k0
                         if k not in ("lr", "initial_lr") and g[k] != k0[k]), None)
    except (ValueError, ZeroDivisionError) as e:
        raise OptionsError(f"the schedule cannot give steps={steps} rates ({e}): give the "
                           "optimizer steps it was made for", option="steps") from None
    finally:
        schedule.load_state_dict(saved)
        for g, k0 in zip(groups, kept):
            g.update(k0)
    if changed is not None:
        raise OptionsError(f"the schedule changes the optimizer's {changed!r} as well as its rate "
                           "(e.g. OneCycleLR's cycle_momentum): a captured step follows a table "
                           "of rates only; turn that off", option="schedule")
    return rows, int(start)


def _without_host_syncs(torch: Any, work: Callable[[], None]) -> None:
    """Runs ``work`` (the first micro-step) and refuses it if it waits for the device or makes
    a shape from values: what the CPU allows, a graph cannot record."""
    from torch.utils._python_dispatch import TorchDispatchMode

    found: List[tuple] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name.startswith("index") and not _bool_index(args):
                name = ""  # indexing by positions has the shape of its index
            if name in _HOST_SYNCS and not found:
                found.append((name, _user_line()))
            return func(*args, **(kwargs or {}))

    with Watch():
        work()
    if found:
        name, where = found[0]
        raise CaptureError(
            f"the step reads a value back to the host or makes a shape from values "
            f"(aten.{name}: {_HOST_SYNCS[name]}){where}, which a CUDA graph cannot record; "
            "keep values as tensors (torch.where, masks multiplied in) or use capture=False")


def _bool_index(args: tuple) -> bool:
    """Whether an ``aten.index``/``index_put`` call indexes by a boolean mask."""
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(str(getattr(i, "dtype", "")) in ("torch.bool", "torch.uint8") for i in indices)


def _user_line() -> str:
    """Where in the user's code the current operator was called: the innermost frame outside
    torch and this module."""
    here = __file__
    for frame in reversed(traceback.extract_stack()):
        file = frame.filename
        if file == here or "/torch/" in file or file.startswith("<"):
            continue
        return f" at {file}:{frame.lineno} ({frame.line})"
    return ""


__all__ = ["CapturedStep", "CaptureError"]
