"""dsc.Loader(static=True): every batch lands in the same tensors (what a captured CUDA graph
reads), with the host path's bytes, on the resident path and the host path; the gather that a
captured step runs itself (gather_in_step=True); and what the feed costs per step, counted in
tensor operations (each one a kernel launch on a GPU), so that a regression shows on CPU CI.
Run here with a CPU "device"; the CUDA tests at the end run where torch sees a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

import dsc

torch = pytest.importorskip("torch")

from test_resident import assert_same_batch, busy_gpu, cuda  # noqa: E402

CASES = [
    dict(batch_size=24),
    dict(batch_size=20, drop_last=False, rank=1, world_size=2),
    dict(batch_size=24, columns=["x", "length", "y"]),
    dict(pack=1024),
    dict(pack=1024, max_seqs=24, drop_last=False, rank=0, world_size=2),
]


def ids(kw: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in kw.items())


def pointers(batch) -> dict:
    return {k: (v.data_ptr(), tuple(v.shape)) for k, v in batch.items()}


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "host"])
@pytest.mark.parametrize("kw", CASES, ids=ids)
def test_static_batches_equal_the_host_batches_in_the_same_tensors(
        cache_dir: Path, resident: bool, kw: dict) -> None:
    host = dsc.Loader(cache_dir, seed=4, epoch=1, **kw)
    static = dsc.Loader(cache_dir, seed=4, epoch=1, device="cpu", static=True,
                        resident=resident, **kw)
    assert static.static and static.resident == resident
    fixed = None
    for epoch in range(2):
        n, steps = 0, len(host)  # a packed epoch's steps depend on its plan
        for a, b in zip(host, static, strict=True):
            fixed = fixed or pointers(b)
            assert pointers(b) == fixed, f"{kw} epoch {epoch} step {a.step}: new tensors"
            assert_same_batch(a, b, f"{kw} epoch {epoch} step {a.step}")
            n += 1
        assert n == steps > 0
    assert pointers(static.static_batch) == fixed
    assert list(fixed) == list(next(iter(dsc.Loader(cache_dir, **kw))))
    # Asked for before the first batch (a graph is captured on them), the same tensors.
    early = dsc.Loader(cache_dir, seed=4, device="cpu", static=True, resident=resident, **kw)
    before = pointers(early.static_batch)
    assert all(pointers(b) == before for b in early)


@pytest.mark.parametrize("kw", [dict(batch_size=24), dict(pack=1024)], ids=ids)
def test_the_staged_path_fills_the_static_block(cache_dir: Path, kw: dict) -> None:
    """The path to a GPU without a resident split (blocks gathered by threads, one copy per
    batch), with a CPU stand-in for the copy: the copy lands in the static block."""
    from dsc._epochs import _HostCopy

    host = dsc.Loader(cache_dir, seed=8, **kw)
    staged = dsc.Loader(cache_dir, seed=8, num_threads=2, prefetch=2, device="cpu",
                        resident=False, static=True, **kw)
    staged._staged = _HostCopy()
    fixed = pointers(staged.static_batch)
    for a, b in zip(host, staged, strict=True):
        assert pointers(b) == fixed
        assert_same_batch(a, b, f"{kw} step {a.step}")


@pytest.mark.parametrize("kw", [dict(batch_size=24), dict(pack=1024)], ids=ids)
def test_gather_in_step_leaves_the_gather_to_the_step(cache_dir: Path, kw: dict) -> None:
    host = dsc.Loader(cache_dir, seed=3, **kw)
    loader = dsc.Loader(cache_dir, seed=3, device="cpu", static=True, gather_in_step=True,
                        resident=True, **kw)
    static = loader.static_batch
    stored = [t.name for t in loader.cache.schema if t.name in static]
    # A gather before the first next() (a graph captured on the buffers) reads real rows of
    # the uploaded split: the split's first context, where the index starts.
    early = loader.gather()
    assert pointers(early) == pointers(static)
    if "pack" not in kw:
        first = next(iter(dsc.Loader(cache_dir, shuffle=False, batch_size=1)))
        for k in stored:
            assert all(torch.equal(row, first[k][0]) for row in early[k]), k
    before = {k: static[k].clone() for k in stored}
    expected = list(host)
    batch = next(iter(loader))
    # next() copied the index only: the stored tensors still hold what they held, bit for bit
    # (fresh buffers hold whatever memory held, NaN patterns included, which equal() refuses).
    for k in stored:
        assert torch.equal(static[k].view(torch.uint8), before[k].view(torch.uint8)), k
    got = loader.gather()
    assert pointers(got) == pointers(static)
    assert_same_batch(expected[0], batch, f"{kw} step 0 after gather()")
    for a, b in zip(expected[1:], loader, strict=True):
        loader.gather()
        assert_same_batch(a, b, f"{kw} step {a.step}")


def test_static_refusals_name_the_option(cache_dir: Path) -> None:
    for kw, option in [
        (dict(static=True), "static"),  # no device
        (dict(static=True, device="cpu", trim=True), "trim"),
        (dict(static=True, device="cpu", bucket=True), "bucket"),
        (dict(gather_in_step=True), "gather_in_step"),
        (dict(static=True, device="cpu", resident=False, gather_in_step=True), "gather_in_step"),
        (dict(static="yes", device="cpu"), "static"),
    ]:
        with pytest.raises(dsc.OptionsError) as e:
            dsc.Loader(cache_dir, batch_size=8, **kw)
        assert e.value.option == option, (kw, e.value)
    with pytest.raises(dsc.OptionsError, match="static=True") as e:
        dsc.Loader(cache_dir, batch_size=8).static_batch
    assert e.value.option == "static"


def count_ops(loader: dsc.Loader, steps: int) -> float:
    """Top-level tensor operations per ``next()`` (each a kernel launch or a view on a GPU),
    counted by torch.profiler around steps after the first (which makes the buffers)."""
    from torch.profiler import ProfilerActivity, profile

    it = iter(loader)
    next(it)
    loader._resident_split.wait()  # the ordinary iterator uploads in the background
    next(it)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            next(it)
            if loader.gather_in_step:
                loader.gather()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    # Top level: not called from inside another aten op (index_select's own empty() etc.).
    top = [e for e in events if not (e.cpu_parent and e.cpu_parent.name.startswith("aten::"))]
    return len(top) / steps


def test_the_resident_feed_costs_a_few_operations_per_step(cache_dir: Path) -> None:
    """The resident feed on a CPU device, per step: the static path issues the index copy and
    one gather per stored tensor, nothing else; the ordinary one adds the index views.
    (docs/PERFORMANCE.md lists the counts; on CUDA each operation is a launch.)"""
    stored = len(dsc.open(cache_dir).schema)
    for kw in (dict(batch_size=24), dict(pack=1024)):
        static = count_ops(dsc.Loader(cache_dir, device="cpu", resident=True, static=True,
                                      **kw), 8)
        assert static <= 1 + stored, (kw, static)
        deferred = count_ops(dsc.Loader(cache_dir, device="cpu", resident=True, static=True,
                                        gather_in_step=True, **kw), 8)
        assert deferred <= 1 + stored, (kw, deferred)
        ordinary = count_ops(dsc.Loader(cache_dir, device="cpu", resident=True, **kw), 8)
        # The block's copy, a gather per stored tensor, views of the index block (3 each).
        own = 5 if "pack" in kw else 0
        assert ordinary <= 1 + stored + 3 * (2 + own), (kw, ordinary)


class SlowEvent:
    """A copy's event that takes 100 ms to complete: a GPU busy with the consumer's work (long
    beside what the loader's own work takes on a loaded 2-core machine)."""

    def synchronize(self) -> None:
        import time
        time.sleep(0.1)


def test_waits_for_the_device_are_not_data_waits(cache_dir: Path) -> None:
    """next() waiting for the device to finish with a buffer (the copy of a few steps back, on
    a GPU that the step keeps busy) is counted as device_wait_s, not as the data stall wait_s:
    on the resident path (the index ring) and on the host path (the producers' blocks)."""
    from dsc import _resident
    from dsc._epochs import _HostCopy

    resident = dsc.Loader(cache_dir, batch_size=24, resident=True, device="cpu", static=True)
    it = iter(resident)
    next(it)
    it.source.ring.copied = [SlowEvent()] * _resident.RING
    for _ in range(4):
        next(it)
    s = resident.stats()
    assert s["device_wait_s"] >= 4 * 0.1 and s["wait_s"] < 0.1, s
    assert resident.device_wait_s == s["device_wait_s"]

    class SlowCopy(_HostCopy):
        def __call__(self, view):
            return view.clone(), SlowEvent()

    staged = dsc.Loader(cache_dir, batch_size=24, num_threads=1, prefetch=1)
    staged._staged = SlowCopy()
    for _ in zip(range(8), staged):
        pass
    s = staged.stats()
    assert s["device_wait_s"] > 0.02 and s["device_wait_s"] + s["wait_s"] >= 0.1, s


@cuda
@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("kw", [dict(batch_size=24), dict(pack=1024)], ids=ids)
def test_cuda_static_batches_equal_the_cpu_loaders_under_a_busy_gpu(
        cache_dir: Path, resident: bool, kw: dict) -> None:
    host = dsc.Loader(cache_dir, seed=2, **kw)
    gpu = dsc.Loader(cache_dir, seed=2, device="cuda", num_threads=3, resident=resident,
                     static=True, **kw)
    fixed = pointers(gpu.static_batch)
    for a, b in zip(host, gpu, strict=True):
        busy_gpu()
        assert pointers(b) == fixed
        copy = {k: v.clone() for k, v in b.items()}  # before the next batch overwrites it
        torch.cuda.synchronize()
        assert_same_batch(a, dsc.Batch(copy, b.epoch, b.step, b.seq_len, b.valid,
                                       b._pack), f"{kw} step {a.step}")


@cuda
@pytest.mark.parametrize("kw", [dict(batch_size=24), dict(pack=1024)], ids=ids)
def test_a_captured_gather_replays_every_batch(cache_dir: Path, kw: dict) -> None:
    """The gather captured in a CUDA graph with a reduction of the batch (a stand-in for a
    step): each replay after next() sees that step's batch."""
    host = dsc.Loader(cache_dir, seed=5, **kw)
    loader = dsc.Loader(cache_dir, seed=5, device="cuda", resident=True, static=True,
                        gather_in_step=True, **kw)
    static = loader.static_batch
    batches = iter(loader)
    next(batches)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        loader.gather()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        b = loader.gather()
        total = b["x"].double().sum()
    expected = list(host)
    # Step 0's index is in place: replay it, then the rest.
    graph.replay()
    assert total.item() == pytest.approx(expected[0]["x"].double().sum().item(), rel=1e-12)
    for a, _ in zip(expected[1:], batches):
        graph.replay()
        assert total.item() == pytest.approx(a["x"].double().sum().item(), rel=1e-12)
        assert torch.equal(static["x"].cpu(), a["x"])
