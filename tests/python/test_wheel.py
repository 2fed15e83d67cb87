"""The built wheel as users install it (issue 43): into fresh virtual environments of the oldest
and newest CPython this machine offers, with nothing but the wheel and what pip brings for it,
then tests/wheel/smoke.py there. scripts/test.sh builds the wheel and names it in DSC_WHEEL."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEEL = os.environ.get("DSC_WHEEL")


def interpreters() -> list:
    """The oldest and the newest CPython >= 3.9 found: pyenv's versions, then python3.X on the
    PATH (the machine's own, and the one running the tests)."""
    found = {}
    roots = []
    if shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
        roots.append(root)
    roots.append(os.path.expanduser("~/.pyenv"))
    candidates = [p for r in roots for p in glob.glob(f"{r}/versions/3.*/bin/python3")]
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in range(9, 20)]
    candidates.append(sys.executable)
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys, venv; print(*sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            version = tuple(int(x) for x in out.stdout.split())
            if version >= (3, 9):
                found.setdefault(version, exe)
    ends = sorted(found)
    return [found[v] for v in sorted({ends[0], ends[-1]})] if ends else []


def expected_version() -> str:
    binary = os.environ.get("DSC_BIN") or str(ROOT / "target" / "debug" / "dsc")
    return subprocess.run([binary, "--version"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(not WHEEL, reason="no wheel built: scripts/test.sh builds one (DSC_WHEEL)")
@pytest.mark.parametrize("python", interpreters() or [None])
def test_the_wheel_installs_and_runs_in_a_fresh_environment(python, tmp_path: Path) -> None:
    assert python, "no CPython >= 3.9 found to install the wheel into"
    version = subprocess.run([python, "--version"], capture_output=True, text=True).stdout
    env_dir = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(env_dir)], check=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet",
           "--disable-pip-version-check"]
    subprocess.run(pip + [WHEEL], check=True)
    # Only the wheel and NumPy: no Rust toolchain involved, no source tree on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DSC_BIN")}
    env["PATH"] = f"{env_dir / 'bin'}:{env.get('PATH', '')}"
    done = subprocess.run([str(env_dir / "bin" / "python"), str(ROOT / "tests/wheel/smoke.py"),
                           str(tmp_path / "work"), expected_version()],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, f"{version}: {done.stderr[-4000:]}"
    checked = json.loads(done.stdout.strip().splitlines()[-1])
    assert checked["from"].startswith(str(env_dir)), checked
    assert checked["same_cache_from_python_and_cli"] and checked["train_contexts_loaded"] > 0
    print(f"{version.strip()}: {checked}")


def test_the_wheel_is_abi3_for_every_python_from_3_9() -> None:
    if not WHEEL:
        pytest.skip("no wheel built: scripts/test.sh builds one (DSC_WHEEL)")
    assert re.search(r"-cp39-abi3-(manylinux|linux)_[^-]*x86_64\.whl$", WHEEL), WHEEL


@pytest.mark.skipif(not WHEEL, reason="no wheel built: scripts/test.sh builds one (DSC_WHEEL)")
def test_ctrl_c_stops_the_console_script_as_it_stops_the_binary(tmp_path: Path) -> None:
    """The console script runs the Rust command inside Python, which would turn SIGINT into a
    flag that the command never checks: Ctrl-C must stop it as it stops the binary."""
    import signal
    import time

    script = Path(sys.executable).parent / "dsc"
    assert script.exists(), f"{script}: scripts/test.sh installs the wheel into this venv"
    outcomes = []
    for exe in (str(script), os.environ.get("DSC_BIN") or str(ROOT / "target/debug/dsc")):
        out = tmp_path / Path(exe).parent.name
        # Long enough to be running when the signal comes (minutes on two cores).
        proc = subprocess.Popen([exe, "gen", "icecube", "--out", str(out), "--files", "400",
                                 "--events-per-file", "20000", "--seed", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(2.0)
        assert proc.poll() is None, f"{exe} ended before the signal: {proc.stderr.read()}"
        proc.send_signal(signal.SIGINT)
        try:
            outcomes.append(proc.wait(timeout=20))
        finally:
            proc.kill()
    assert outcomes[0] == outcomes[1] != 0, outcomes


@pytest.mark.skipif(not WHEEL, reason="no wheel built: scripts/test.sh builds one (DSC_WHEEL)")
def test_the_console_script_removes_the_cache_it_replaced_before_it_returns(tmp_path: Path) -> None:
    """The binary hands a replaced cache to a `dsc` process of its own; the console script runs
    inside Python, which cannot be started as that process (it would run a script named
    `remove-replaced`), so it removes the old cache itself, and nothing is left beside `out`."""
    script = Path(sys.executable).parent / "dsc"
    assert script.exists(), f"{script}: scripts/test.sh installs the wheel into this venv"
    # A file Python would run if it were started as the remover.
    (tmp_path / "remove-replaced").write_text("open('ran', 'w').write('python ran me')\n")
    subprocess.run([str(script), "gen", "icecube", "--out", "data", "--files", "2",
                    "--events-per-file", "60", "--seed", "3"], check=True, cwd=tmp_path,
                   capture_output=True)
    flags = ["data/train/batch_*.parquet", "--key", "event_id", "--order-by", "time",
             "--features", "time,charge", "--max-len", "32", "--out", "cache", "--quiet"]
    for seed in ("1", "2"):
        done = subprocess.run([str(script), "compile", *flags, "--seed", seed, "--force"],
                              cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".cache."))
    assert left == [".cache.dsc-lock"], left
    assert not (tmp_path / "ran").exists()
    assert json.loads((tmp_path / "cache/manifest.json").read_text())["spec"]["seed"] == 2
