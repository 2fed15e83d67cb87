"""dsc.CapturedStep, the whole training step as CUDA graphs around a user's own model, loss and
optimizer: on the CPU it runs the same functions uncaptured, so these tests hold a user loop
written with it to the plain eager loop (same weights, padded and packed, with accumulation,
clipping and a schedule), to an uninterrupted run across a saved position, and to its refusals
of what a graph cannot record, which it gives on every device. The CUDA case at the end runs
where torch sees a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

import dsc

torch = pytest.importorskip("torch")
nn = torch.nn

from test_resident import cuda  # noqa: E402

SHAPES = [dict(batch_size=24, trim=False), dict(pack=1024)]


def ids(kw: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in kw.items())


class Pulses(nn.Module):
    """A small network over the pulses: each step's features and sensor embedded, pooled per
    event (a masked mean, or a sum over ``seq_idx`` for packs), a head to the two angles."""

    def __init__(self, sensors: int) -> None:
        super().__init__()
        self.step = nn.Linear(6, 16)
        self.sensor = nn.Embedding(sensors, 16)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(16, 2))
        # x, y, z are metres (about +-500); the others are on a unit scale.
        self.register_buffer("scale", torch.tensor([2e-3, 2e-3, 2e-3, 1.0, 1.0, 1.0]))

    def forward(self, b: dict) -> torch.Tensor:
        h = self.step(b["x"] * self.scale) + self.sensor(b["sensor_id"].long())
        n = b["length"].clamp(min=1).unsqueeze(-1).to(h.dtype)
        if "seq_idx" in b:  # packed: [T, 16] tokens summed into their sequence's row
            rows = b["length"].shape[0]
            pooled = h.new_zeros(rows + 1, h.shape[-1]).index_add_(0, b["seq_idx"].long(), h)
            return self.head(pooled[:rows] / n)
        mask = torch.arange(h.shape[1], device=h.device) < b["length"].unsqueeze(1)
        return self.head((h * mask.unsqueeze(-1)).sum(1) / n)


def loss_fn(model: nn.Module, b: dict) -> torch.Tensor:
    """Mean squared error per event; in a pack only its ``num_seqs`` leading rows count."""
    per = ((model(b) - b["y"]) ** 2).mean(-1)
    if "num_seqs" not in b:
        return per.mean()
    n = b["num_seqs"].reshape(())
    used = torch.arange(per.shape[0], device=per.device) < n
    return torch.where(used, per, 0.0).sum() / n.clamp(min=1)


def warm_then_cosine(step: int) -> float:
    return min(1.0, (step + 1) / 5) * (0.55 + 0.45 * torch.cos(torch.tensor(step / 40.0)).item())


def build(cache: Path, device: str = "cpu"):
    torch.manual_seed(3)
    model = Pulses(dsc.open(cache).vocab_size("sensor_id")).to(device)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": other, "weight_decay": 0.0}], lr=1e-2)
    return model, opt


def eager_run(cache: Path, shape: dict, accumulate: int, clip: float, epochs: int) -> dict:
    """The plain PyTorch loop a user writes first."""
    model, opt = build(cache)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warm_then_cosine)
    loader = dsc.Loader(cache, seed=5, **shape)
    micro = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            (loss_fn(model, batch) / accumulate).backward()
            micro += 1
            if micro % accumulate == 0:
                if clip:
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                sched.step()
                opt.zero_grad()
    return model.state_dict()


def captured_run(cache: Path, shape: dict, accumulate: int, clip: float, epochs: int,
                 schedule: str = "function") -> dict:
    model, opt = build(cache)
    loader = dsc.Loader(cache, seed=5, device="cpu", static=True, **shape)
    steps = epochs * len(loader) // accumulate
    sched = (warm_then_cosine if schedule == "function"
             else torch.optim.lr_scheduler.LambdaLR(opt, warm_then_cosine))
    step = dsc.CapturedStep(model, loss_fn, opt, loader, accumulate=accumulate, clip=clip,
                            schedule=sched, steps=steps)
    losses = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for _ in loader:
            step()
        losses.append(step.loss())
    assert step.optimizer_steps == epochs * len(loader) // accumulate
    assert not step.captured
    assert step.loss() != step.loss()  # read once, then NaN until more steps
    if epochs > 1:
        assert losses[-1] < losses[0], losses  # it learns
    return model.state_dict()


def relative_difference(a: dict, b: dict) -> float:
    num = sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a) ** 0.5
    return float(num / sum((a[k].double() ** 2).sum() for k in a) ** 0.5)


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("accumulate,clip", [(1, 0.0), (2, 0.5)], ids=["plain", "acc2_clip"])
def test_a_user_loop_trains_to_the_eager_loops_weights(cache_dir, shape, accumulate, clip):
    """Two epochs of the user loop around CapturedStep against the eager loop: the same weights
    within 1e-5 relative (the schedule's rates are float32 on the device, the eager loop's
    float64 in LambdaLR), and far from the initial ones (it trained)."""
    eager = eager_run(cache_dir, shape, accumulate, clip, epochs=2)
    captured = captured_run(cache_dir, shape, accumulate, clip, epochs=2)
    assert relative_difference(eager, captured) < 1e-5
    initial = build(cache_dir)[0].state_dict()
    assert relative_difference(eager, initial) > 1e-2


def test_a_torch_scheduler_becomes_the_same_table(cache_dir):
    """A torch.optim.lr_scheduler scheduler is read ahead into the device table and put back
    where it stood: the run equals the one with the same schedule as a function."""
    shape = SHAPES[0]
    a = captured_run(cache_dir, shape, 1, 0.0, epochs=1, schedule="function")
    b = captured_run(cache_dir, shape, 1, 0.0, epochs=1, schedule="scheduler")
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_a_saved_position_resumes_to_the_same_weights(cache_dir, tmp_path, shape):
    """Stopped in the middle of an accumulation, saved (model, optimizer, the step's position,
    the loader's state) and continued by new objects: the weights of the run that never
    stopped, bit for bit on the CPU."""
    def run(stop_after=None, state=None):
        model, opt = build(cache_dir)
        loader = dsc.Loader(cache_dir, seed=5, device="cpu", static=True, **shape)
        step = dsc.CapturedStep(model, loss_fn, opt, loader, accumulate=2, clip=0.5,
                                schedule=warm_then_cosine, steps=len(loader))
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            step.load_state_dict(state["step"])
            loader.load_state_dict(state["loader"])
        for i, _ in enumerate(loader):
            step()
            if stop_after is not None and i + 1 == stop_after:
                return dict(model=model.state_dict(), optimizer=opt.state_dict(),
                            step=step.state_dict(), loader=loader.state_dict())
        return model.state_dict()

    whole = run()
    saved = run(stop_after=7)
    assert (saved["step"]["optimizer_steps"], saved["step"]["micro_steps"]) == (3, 1)
    assert len(saved["step"]["grads"]) == len(list(build(cache_dir)[0].parameters()))
    torch.save(saved, tmp_path / "ckpt.pt")
    resumed = run(state=torch.load(tmp_path / "ckpt.pt", weights_only=True))
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k


def test_refusals_name_what_to_change(cache_dir):
    """What a graph cannot record is refused at once, on the CPU as on a GPU, with the line and
    the change to make."""
    def make(loss=loss_fn, opt=None, static=True, **kw):
        model, adamw = build(cache_dir)
        loader = dsc.Loader(cache_dir, batch_size=24, trim=False, device="cpu", static=static)
        if opt is not None:
            adamw = opt(model.parameters())
        return dsc.CapturedStep(model, loss, adamw, loader, **kw), loader

    def reads_back(model, b):
        loss = loss_fn(model, b)
        if loss.item() > 1e6:  # a host sync: the graph would freeze this branch
            raise RuntimeError
        return loss

    def masks(model, b):
        return ((model(b) - b["y"]) ** 2)[b["length"] > 3].mean()

    for loss, words in [(reads_back, r"aten._local_scalar_dense: \.item\(\).*test_captured.py"),
                        (masks, "boolean mask index")]:
        step, loader = make(loss)
        next(iter(loader))
        with pytest.raises(dsc.CaptureError, match=words):
            step()
    # The same loss runs with capture=False (eagerly, everywhere: to debug).
    step, loader = make(reads_back, capture=False)
    next(iter(loader))
    step()

    for kw, option, words in [
        (dict(static=False), "loader", "static=True"),
        (dict(opt=lambda p: torch.optim.LBFGS(p)), "optimizer", "LBFGS cannot run inside"),
        (dict(opt=lambda p: torch.optim.Adagrad(p)), "optimizer", "use Adam, AdamW or SGD"),
        (dict(opt=lambda p: torch.optim.AdamW(p, lr=float("inf"))), "optimizer",
         "learning rate inf"),
        (dict(autocast=torch.float16), "autocast", "use torch.bfloat16"),
        (dict(schedule=warm_then_cosine), "steps", "give steps="),
        (dict(schedule=lambda s: float("nan"), steps=3), "schedule", "nan at optimizer step 0"),
        (dict(accumulate=0), "accumulate", "at least 1"),
        (dict(clip=float("inf")), "clip", "zero"),
    ]:
        with pytest.raises(dsc.OptionsError, match=words) as e:
            make(**kw)
        assert e.value.option == option, kw
    model, opt = build(cache_dir)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    loader = dsc.Loader(cache_dir, batch_size=24, trim=False, device="cpu", static=True)
    with pytest.raises(dsc.OptionsError, match="ReduceLROnPlateau"):
        dsc.CapturedStep(model, loss_fn, opt, loader, schedule=plateau, steps=10)
    # SGD's update can be captured.
    make(opt=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))


def test_the_edges_a_review_found(cache_dir):
    """A scheduler already stepped continues from its step; one that changes more than the rate
    (OneCycleLR's momentum) is refused and leaves the optimizer as it was; SGD with a schedule
    must be fused; drop_last=False is refused; loading a position clears gradients summed
    since; an optimizer state loaded after the first call is refused, not silently ignored."""
    def loader(**kw):
        return dsc.Loader(cache_dir, batch_size=24, trim=False, device="cpu", static=True, **kw)

    model, opt = build(cache_dir)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1))
    for _ in range(3):
        opt.step()
        sched.step()
    step = dsc.CapturedStep(model, loss_fn, opt, loader(), schedule=sched, steps=10)
    assert step.optimizer_steps == 3
    assert step.lr()[0] == pytest.approx(sched.get_last_lr()[0])

    model, opt = build(cache_dir)
    cycle = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=20)
    betas = opt.param_groups[0]["betas"]  # OneCycleLR's own start
    with pytest.raises(dsc.OptionsError, match="betas.*cycle_momentum") as e:
        dsc.CapturedStep(model, loss_fn, opt, loader(), schedule=cycle, steps=20)
    assert e.value.option == "schedule" and opt.param_groups[0]["betas"] == betas
    flat = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=20,
                                               cycle_momentum=False)
    dsc.CapturedStep(model, loss_fn, opt, loader(), schedule=flat, steps=20)
    with pytest.raises(dsc.OptionsError, match="steps=30") as e:
        dsc.CapturedStep(model, loss_fn, opt, loader(), schedule=flat, steps=30)

    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(dsc.OptionsError, match="fused=True"):
        dsc.CapturedStep(model, loss_fn, sgd, loader(), schedule=lambda s: 1.0, steps=5)
    with pytest.raises(dsc.OptionsError, match="drop_last=True") as e:
        dsc.CapturedStep(model, loss_fn, opt, loader(drop_last=False))
    assert e.value.option == "loader"

    model, opt = build(cache_dir)
    feed = loader()
    step = dsc.CapturedStep(model, loss_fn, opt, feed, accumulate=2)
    batches = iter(feed)
    next(batches)
    step()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    step.load_state_dict(dict(optimizer_steps=0))
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.parameters())

    model, opt = build(cache_dir)
    feed = loader()
    step = dsc.CapturedStep(model, loss_fn, opt, feed, schedule=lambda s: 1.0, steps=5)
    batches = iter(feed)
    next(batches)
    step()
    opt.load_state_dict(build(cache_dir)[1].state_dict())
    next(batches)
    with pytest.raises(dsc.CaptureError, match="load the optimizer's state before"):
        step()


@cuda
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_cuda_the_captured_loop_learns_as_the_eager_loop(cache_dir, shape):
    """On a GPU, where it captures: the step replays after its warm-up and the weights stay
    close to the CPU's eager run (kernels add in other orders: not equal)."""
    eager = eager_run(cache_dir, shape, 2, 0.5, epochs=2)
    model, opt = build(cache_dir, "cuda")
    loader = dsc.Loader(cache_dir, seed=5, device="cuda", static=True, resident=True,
                        gather_in_step=True, **shape)
    step = dsc.CapturedStep(model, loss_fn, opt, loader, accumulate=2, clip=0.5,
                            schedule=warm_then_cosine, steps=2 * len(loader) // 2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for _ in loader:
            step()
    assert step.captured
    assert step.loss() < 5
    got = {k: v.cpu() for k, v in model.state_dict().items()}
    assert relative_difference(eager, got) < 0.2


def test_the_convolutional_example_learns(cache_dir):
    """examples/pulses_conv.py, a network that is not dsc's own in a loop of its own around
    CapturedStep: its validation angular error ends below the mean direction's."""
    import importlib.util
    import sys

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("dsc_example_pulses_conv",
                                                  REPO / "examples" / "pulses_conv.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        s = module.main(["--cache", str(cache_dir), "--epochs", "5", "--batch-size", "64",
                         "--dim", "32", "--layers", "3", "--device", "cpu"])
    finally:
        sys.modules.pop(spec.name, None)
    last = s["epochs"][-1]
    assert s["optimizer_steps"] == 5 * (len(dsc.Loader(cache_dir, batch_size=64)))
    assert last["train_loss"] < s["epochs"][0]["train_loss"]
    assert last["model"] < 0.95 * last["baseline"], s["epochs"]
