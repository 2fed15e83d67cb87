"""Where a training step's time goes, for a script's own loop: the host blocked waiting for data,
the copy to the device and the device's compute, per logged window and for the run, with no
host sync of its own (CUDA events are read when the window's loss read-back has drained the
queue anyway). Used by examples/train.py; copy it into a loop of your own.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import torch


class StepTimer:
    """Where a window's time went: data wait (host), host-to-device and compute.

    On CUDA three events per micro-batch (before the copy, after it, after the step's work) are
    read only when the window closes, right after the loss read-back has drained the queue, so
    the timing adds no sync of its own.
    """

    def __init__(self, device: torch.device, per_step: bool = True):
        """``per_step`` False (a captured step, where the copy is inside the graph): two events
        per window, around all of its device work, and no h2d share."""
        self.cuda = device.type == "cuda"
        self.per_step = per_step
        self.events: List[Tuple[Any, Any, Any]] = []
        self.window: Optional[Any] = None
        self.totals = dict(wall=0.0, data_wait=0.0, h2d=0.0, compute=0.0, samples=0)
        self.reset()

    def reset(self) -> None:
        self.start_time, self.used = time.perf_counter(), 0
        self.cur = dict(data_wait=0.0, samples=0)
        if self.cuda and not self.per_step:
            self.window = torch.cuda.Event(enable_timing=True)
            self.window.record()

    def _event(self, i: int):
        if self.used == len(self.events):
            self.events.append(tuple(torch.cuda.Event(enable_timing=True) for _ in range(3)))
        return self.events[self.used][i]

    def before_copy(self) -> None:
        if self.cuda and self.per_step:
            self._event(0).record()

    def after_copy(self) -> None:
        if self.cuda and self.per_step:
            self._event(1).record()

    def step_done(self, samples: int) -> None:
        self.cur["samples"] += samples
        if self.cuda and self.per_step:
            self._event(2).record()
            self.used += 1

    def close(self) -> Dict[str, float]:
        """Ends the window: its shares, also added to the run totals."""
        h2d = compute = 0.0
        if self.window is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            compute = self.window.elapsed_time(end) / 1e3
        elif self.cuda and self.used:
            self.events[self.used - 1][2].synchronize()
            for start, copied, done in self.events[: self.used]:
                h2d += start.elapsed_time(copied) / 1e3
                compute += copied.elapsed_time(done) / 1e3
        wall = time.perf_counter() - self.start_time
        if not self.cuda:
            compute = max(0.0, wall - self.cur["data_wait"])
        w = dict(wall=wall, data_wait=self.cur["data_wait"], h2d=h2d, compute=compute,
                 samples=self.cur["samples"])
        for k, v in w.items():
            self.totals[k] += v
        self.reset()
        return shares(w)


def shares(t: Dict[str, float]) -> Dict[str, float]:
    wall = max(t["wall"], 1e-12)
    return dict(samples_per_s=t["samples"] / wall, data_wait_share=t["data_wait"] / wall,
                h2d_share=t["h2d"] / wall, compute_share=t["compute"] / wall)
