"""`dsc.Loader([a, b], schedule=...)`: mixture schedules against `dsc order --schedule`; each
cache's own epochs drawn whole, resume anywhere, amendment at a checkpoint, progress in
`stats()`, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsc
from conftest import run_dsc
from test_mix import mixdir, stored  # noqa: F401 (the module's caches)

# A source entering mid-run: `b` out for the first 400 positions, then moving in over
# 400..1200, then even; epochs of 1000 positions in blocks of 64.
ENTERING = [(0, [1.0, 0.0]), (400, [1.0, 0.0]), (1200, [0.5, 0.5], "linear")]
KW = dict(mix_samples=1000, window=64, batch_size=8)


def flat(loader) -> list:
    return [k for b in loader for k in b["key"].tolist()]


def test_a_schedule_gives_dsc_orders_batches_and_draws_whole_epochs(mixdir: Path) -> None:
    caches = [mixdir / "a", mixdir / "b"]
    in_a, in_b = set(stored(mixdir / "a")), set(stored(mixdir / "b"))
    (mixdir / "entering.json").write_text(json.dumps(
        [{"at": at, "weights": w, "linear": len(rest) > 0} for at, w, *rest in ENTERING]))
    drawn = {"a": [], "b": []}
    for epoch in range(3):
        loader = dsc.Loader(caches, schedule=ENTERING, epoch=epoch, **KW)
        got = [b["key"].tolist() for b in loader]
        cli = json.loads(run_dsc("order", "a", "b", "--schedule", "entering.json",
                                 "--mix-samples", "1000", "--window", "64", "--batch-size", "8",
                                 "--epoch", str(epoch), "--keys", "--json", cwd=mixdir))
        assert got == cli
        keys = [k for b in got for k in b]
        if epoch == 0:
            assert all(k in in_a for k in keys[:448]), "b enters after 400"
            assert any(k in in_b for k in keys[448:])
        for k in keys:
            drawn["a" if k in in_a else "b"].append(k)
    # Each cache's draws: its split once per own epoch, one epoch after another.
    for name, own in (("a", in_a), ("b", in_b)):
        for start in range(0, len(drawn[name]), len(own)):
            chunk = drawn[name][start:start + len(own)]
            assert len(set(chunk)) == len(chunk), f"{name} repeated a context"
    # Even weights from 1200: epoch 2 is half and half within a position per block.
    share_b = sum(k in in_b for k in keys) / len(keys)
    assert abs(share_b - 0.5) < 0.01


def test_a_schedule_resumes_anywhere_and_is_amended_at_a_checkpoint(mixdir: Path) -> None:
    caches = [mixdir / "a", mixdir / "b"]
    whole = flat(dsc.Loader(caches, schedule=ENTERING, **KW))
    for steps in (10, 50, 56, 100):  # 56 x 8 = 448: the first block of b
        loader = dsc.Loader(caches, schedule=ENTERING, **KW)
        it = iter(loader)
        for _ in range(steps):
            next(it)
        state = loader.state_dict()
        assert state["schedule"][1] == {"at": 400, "weights": [1.0, 0.0]}
        other = dsc.Loader(caches, schedule=ENTERING, **KW)
        other.load_state_dict(state)
        assert flat(other) == whole[steps * 8:]
        progress = loader.stats()["mix"]
        assert progress["position"] == steps * 8
        assert progress["stage"] == (0 if steps * 8 < 448 else 1)  # from the block at 448
    # At 400 (step 50), b's ramp is under way: its end may not move, a later stage may come.
    loader = dsc.Loader(caches, schedule=ENTERING, **KW)
    it = iter(loader)
    for _ in range(50):
        next(it)
    state = loader.state_dict()
    moved = ENTERING[:2] + [(1100, [0.5, 0.5], "linear")]
    with pytest.raises(dsc.StateError, match="stage 2 differs before"):
        dsc.Loader(caches, schedule=moved, **KW).load_state_dict(state)
    # At 1400 (step 50 of epoch 1), past the ramp: `a` retired from 1500 is taken, and applies
    # from the first block after the state's own (1344..1408): b alone from 1536.
    in_b = set(stored(mixdir / "b"))
    epoch1 = dict(KW, epoch=1)
    whole1 = flat(dsc.Loader(caches, schedule=ENTERING, **epoch1))
    loader = dsc.Loader(caches, schedule=ENTERING, **epoch1)
    it = iter(loader)
    for _ in range(50):
        next(it)
    later = ENTERING + [(1500, [0.0, 1.0])]
    amended = dsc.Loader(caches, schedule=later, **epoch1)
    amended.load_state_dict(loader.state_dict())
    got = flat(amended)
    assert got[:1408 - 1400] == whole1[400:408]
    assert all(k in in_b for k in got[1536 - 1400:])
    assert not all(k in in_b for k in whole1[536:]), "without the amendment a is still drawn"
    # The stage in force and each cache's realised share of it.
    loader = dsc.Loader(caches, schedule=ENTERING, epoch=2, **KW)
    mix = loader.stats()["mix"]
    assert mix["stage"] == 2 and mix["at"] == 1200 and mix["weights"] == [0.5, 0.5]
    flat(loader)
    mix = loader.stats()["mix"]
    # Shares are counted by whole blocks of 64 positions.
    assert 0 <= mix["position"] - 1200 - sum(mix["drawn"]) < 64, mix
    assert all(abs(r - 0.5) < 0.01 for r in mix["realised"]), mix


def test_bad_schedules_are_refused_naming_the_keyword(mixdir: Path) -> None:
    caches = [mixdir / "a", mixdir / "b"]
    for schedule, says in (("0.5,0.5", "expected a list of stages"),
                           ([(0, [1, 1], "slow")], 'the third item, when given, is "linear"'),
                           ([(0, 1)], "expected one number per cache"),
                           ([(0, [1, 1]), (0, [1, 2])], "stage 1 starts at 0, not after"),
                           ([(10, [1, 1])], "the first stage starts at position 0"),
                           ([(0, [1, float("nan")])], "not a value this option takes")):
        with pytest.raises(dsc.OptionsError, match="schedule") as e:
            dsc.Loader(caches, schedule=schedule, **KW)
        assert says in str(e.value), (schedule, str(e.value))
    # NumPy numbers and a whole position computed in floating point are taken as given.
    import numpy as np
    numpy_stages = [(np.int64(0), np.array([1.0, 0.0], dtype=np.float32)),
                    (0.5 * 800, np.array([1, 1]))]
    assert len(dsc.Loader(caches, schedule=numpy_stages, **KW)) > 0
    with pytest.raises(dsc.OptionsError, match="exclude each other"):
        dsc.Loader(caches, schedule=ENTERING, weights=[1, 1], **KW)
    with pytest.raises(dsc.OptionsError, match="is for a mix"):
        dsc.Loader(caches[0], schedule=ENTERING, **KW)


def test_train_py_follows_a_schedule_and_amends_it_on_resume(mixdir: Path, tmp_path: Path) -> None:
    """examples/train.py --mix --schedule: stages by optimizer step, logged as they change,
    the stage in the summary; a resume takes a later stage and refuses an earlier change."""
    import subprocess
    import sys

    from conftest import REPO

    caches = [mixdir / "a", mixdir / "b"]
    per_epoch = len(dsc.Loader(caches, batch_size=32))

    def schedule(name: str, stages: list) -> str:
        path = tmp_path / name
        path.write_text(json.dumps(stages))
        return str(path)

    entering = [{"step": 0, "weights": [1, 0]}, {"step": per_epoch, "weights": [1, 0]},
                {"step": 2 * per_epoch, "weights": [0.5, 0.5], "linear": True}]
    small = ["--dim", "32", "--layers", "1", "--heads", "2", "--batch-size", "32",
             "--torch-threads", "1", "--device", "cpu"]

    def train(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "examples" / "train.py"), *args, *small],
                              capture_output=True, text=True, timeout=600)

    out = tmp_path / "run"
    first = train("--cache", str(caches[0]), "--mix", str(caches[1]), "--schedule",
                  schedule("entering.json", entering), "--epochs", "3", "--out", str(out),
                  "--max-steps", str(per_epoch + per_epoch // 2), "--log-every", "5")
    assert first.returncode == 0, first.stderr
    # Logged as they change (not only in the summary): stage 0 from the start, then 1.
    logged = [line for line in (first.stderr + first.stdout).splitlines()
              if line.startswith("mix · stage") and ") at sample " in line]
    assert any(line.startswith("mix · stage 0 (from sample 0)") for line in logged), logged
    assert any(line.startswith(f"mix · stage 1 (from sample {per_epoch * 32})")
               for line in logged), logged
    moved = entering[:2] + [dict(entering[2], step=2 * per_epoch + 1)]
    refused = train("--resume", str(out / "last.pt"), "--schedule", schedule("moved.json", moved))
    assert refused.returncode != 0 and "stage 2 differs before" in refused.stderr, refused.stderr
    later = entering + [{"step": 2 * per_epoch + per_epoch // 2, "weights": [0, 1]}]
    taken = train("--resume", str(out / "last.pt"), "--schedule", schedule("later.json", later),
                  "--epochs", "4")
    assert taken.returncode == 0, taken.stderr
    summary = json.loads(taken.stdout.strip().splitlines()[-1])
    mix = summary["loader"]["mix"]
    assert mix["stage"] == 3, mix
    # The last stage has b alone: all it realised is b's.
    assert mix["realised"] == [0.0, 1.0], mix
    assert any(line.startswith("mix · stage 3 (") and ") at sample " in line
               for line in taken.stderr.splitlines()), taken.stderr
