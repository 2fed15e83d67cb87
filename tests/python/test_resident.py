"""dsc.Loader(resident=...): a split kept on the device and gathered there by index must give
the host path's batches byte for byte (order, trimming, bucketing, packing, ranks, the last
batch, resume). Run here with a CPU "device" (the same code as on a GPU); the CUDA tests at
the end run where torch sees a GPU, keeping it busy while comparing every delivered batch."""

from __future__ import annotations

from pathlib import Path

import pytest

import dsc

torch = pytest.importorskip("torch")

CASES = [
    dict(batch_size=24),
    dict(batch_size=24, trim=True),
    dict(batch_size=24, bucket=True),
    dict(batch_size=24, bucket=True, trim_multiple=16),
    dict(batch_size=20, drop_last=False, rank=1, world_size=2),
    dict(batch_size=24, shuffle=False),
    dict(batch_size=24, columns=["x", "length", "y"]),
    dict(pack=1024),
    dict(pack=1024, max_seqs=24, drop_last=False, rank=0, world_size=2),
]


def assert_same_batch(a: dsc.Batch, b: dsc.Batch, what: str) -> None:
    assert list(a) == list(b), what
    for k in a:
        x, y = a[k], b[k].cpu()
        assert (x.dtype, x.shape, x.is_contiguous()) == (y.dtype, y.shape, y.is_contiguous()), (what, k)
        assert torch.equal(x, y), (what, k)
    assert (a.step, a.seq_len, a.valid, a.seqs, a.tokens, a.max_seqlen) == (
        b.step, b.seq_len, b.valid, b.seqs, b.tokens, b.max_seqlen), what


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_resident_batches_equal_the_host_batches(cache_dir: Path, kw: dict) -> None:
    host = dsc.Loader(cache_dir, seed=4, epoch=1, **kw)
    resident = dsc.Loader(cache_dir, seed=4, epoch=1, resident=True, **kw)
    assert resident.resident and not host.resident
    assert len(host) == len(resident)
    for epoch in range(2):
        n, steps = 0, len(host)  # a packed epoch's steps depend on its plan
        for a, b in zip(host, resident, strict=True):
            assert_same_batch(a, b, f"{kw} epoch {epoch} step {a.step}")
            n += 1
        assert n == steps > 0
    # The split went to the device once, not per epoch.
    assert resident._resident_split is not None


def test_resident_resumes_mid_epoch(cache_dir: Path) -> None:
    for kw in (dict(batch_size=24, bucket=True), dict(pack=1024)):
        full = list(dsc.Loader(cache_dir, seed=9, resident=True, **kw))
        first = dsc.Loader(cache_dir, seed=9, resident=True, **kw)
        it = iter(first)
        for _ in range(5):
            next(it)
        state = first.state_dict()
        again = dsc.Loader(cache_dir, seed=9, resident=True, **kw)
        again.load_state_dict(state)
        rest = list(again)
        assert len(rest) == len(full) - 5
        for a, b in zip(full[5:], rest, strict=True):
            assert_same_batch(a, b, f"{kw} step {a.step}")
        # A host loader takes the same state: residency is not part of the order.
        host = dsc.Loader(cache_dir, seed=9, **kw)
        host.load_state_dict(state)
        assert_same_batch(next(iter(host)), rest[0], f"{kw} host after resume")


def test_resident_options_and_budget(cache_dir: Path) -> None:
    cache = dsc.open(cache_dir)
    # On the CPU the default keeps the host path; a GPU device turns it on when it fits.
    assert not dsc.Loader(cache, batch_size=8).resident
    assert dsc.Loader(cache, batch_size=8, resident=True, resident_budget="1GiB").resident
    need = dsc._resident.split_bytes(dsc.Loader(cache, batch_size=8))
    with pytest.raises(dsc.OptionsError, match="resident_budget"):
        dsc.Loader(cache, batch_size=8, resident=True, resident_budget=need - 1)
    # Fewer columns take less: the same budget then fits.
    few = dsc.Loader(cache, batch_size=8, resident=True, resident_budget=need - 1,
                     columns=["x", "length"])
    assert few.resident and list(next(iter(few))) == ["x", "length"]
    with pytest.raises(dsc.OptionsError, match="format='torch'"):
        dsc.Loader(cache, batch_size=8, resident=True, format="numpy")
    with pytest.raises(dsc.OptionsError, match="resident="):
        dsc.Loader(cache, batch_size=8, resident="yes")
    with pytest.raises(dsc.OptionsError):
        dsc.Loader(cache, batch_size=8, resident=True, resident_budget="lots")


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("kw", [dict(batch_size=24, trim=True), dict(batch_size=24, bucket=True),
                                dict(pack=1024), dict(batch_size=20, drop_last=False)],
                         ids=["trim", "bucket", "pack", "keep_last"])
def test_the_staged_path_gives_the_same_batches(cache_dir: Path, threads: int, kw: dict) -> None:
    """The path to a GPU (whole batches gathered into a ring of blocks, one copy per batch),
    run with a CPU stand-in for the copy: the host path's batches, every step, in order."""
    from dsc._epochs import _HostCopy

    host = dsc.Loader(cache_dir, seed=8, **kw)
    staged = dsc.Loader(cache_dir, seed=8, num_threads=threads, prefetch=2, **kw)
    staged._staged = _HostCopy()
    for epoch in range(2):
        steps = len(host)
        got = list(staged)
        assert len(got) == steps
        for a, b in zip(host, got, strict=True):
            assert_same_batch(a, b, f"{kw} t{threads} epoch {epoch} step {a.step}")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def busy_gpu():
    """Work that keeps the GPU's default stream busy for a while (queued, not waited for)."""
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        a = a @ a
        a = a / a.norm()
    return a


@cuda
@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("kw", [dict(batch_size=24, bucket=True), dict(pack=1024)])
def test_cuda_batches_equal_the_cpu_loaders_under_a_busy_gpu(cache_dir: Path, resident: bool,
                                                             kw: dict) -> None:
    """Every batch delivered to the GPU (host path: pinned gathers and non-blocking copies;
    resident: gathers on the GPU) equals the CPU loader's, while the GPU is kept busy so that
    a reused buffer would be caught being overwritten before its copy ran."""
    host = dsc.Loader(cache_dir, seed=2, **kw, trim_multiple=16 if "bucket" in kw else None)
    gpu = dsc.Loader(cache_dir, seed=2, device="cuda", num_threads=3, resident=resident, **kw)
    assert gpu.resident == resident
    delivered = []
    for b in gpu:
        busy_gpu()
        delivered.append(b)
    torch.cuda.synchronize()
    for a, b in zip(host, delivered, strict=True):
        assert_same_batch(a, b, f"{kw} step {a.step}")


@pytest.mark.parametrize("kw", [dict(batch_size=24, bucket=True), dict(pack=1024)],
                         ids=["bucket", "pack"])
def test_the_first_steps_come_from_the_host_path_while_the_split_uploads(
        cache_dir: Path, kw: dict) -> None:
    """The split uploads in the background (on a GPU, on a stream of its own), so the first
    step does not wait for it: until it is there each batch is gathered on the host and copied
    in one block, then the rest come from the device. The same batches either way; the upload
    held here (a test gate) to see both."""
    import threading

    from dsc import _resident

    host = list(dsc.Loader(cache_dir, seed=6, **kw))
    gate = threading.Event()
    _resident.UPLOAD_GATE = gate
    try:
        loader = dsc.Loader(cache_dir, seed=6, resident=True, **kw)
        batches = iter(loader)
        early = [next(batches) for _ in range(3)]
        assert loader.stats()["upload_steps"] == 3 and loader.stats()["upload_s"] is None
        gate.set()
        loader._resident_split.wait()
        rest = list(batches)
    finally:
        _resident.UPLOAD_GATE = None
    s = loader.stats()
    assert s["upload_steps"] == 3 and s["upload_s"] > 0, s
    for a, b in zip(host, early + rest, strict=True):
        assert_same_batch(a, b, f"{kw} step {a.step}")
    # A failed upload is raised in the consumer's thread, by the next batch.
    def failing(*args):
        raise OSError("the disk went away")
    keep, _resident._upload = _resident._upload, failing
    try:
        with pytest.raises(OSError, match="went away"):
            broken = iter(dsc.Loader(cache_dir, seed=6, resident=True, **kw))
            for _ in range(len(host)):
                next(broken)
    finally:
        _resident._upload = keep
