"""`dsc/_dsc.pyi`, the typing stub of the Rust extension, written by hand, names exactly what the
extension has: every class, method and function of one is in the other (issue 29, item 6)."""

from __future__ import annotations

import ast
from pathlib import Path

import dsc
from dsc import _dsc

STUB = Path(dsc.__file__).with_name("_dsc.pyi")


def public(names) -> set:
    return {n for n in names if not n.startswith("_")}


def test_the_stub_names_what_the_extension_has() -> None:
    tree = ast.parse(STUB.read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: {m.name for m in n.body if isinstance(m, ast.FunctionDef)}
               for n in tree.body if isinstance(n, ast.ClassDef)}
    # Module level: classes and functions (the stub's type aliases are not the extension's).
    have = {n for n in public(dir(_dsc)) if callable(getattr(_dsc, n))}
    assert have == functions | set(classes), (
        f"in the extension only: {sorted(have - functions - set(classes))}; "
        f"in the stub only: {sorted(functions | set(classes) - have)}"
    )
    for name, methods in classes.items():
        cls = getattr(_dsc, name)
        real = {m for m in public(vars(cls)) if callable(getattr(cls, m, None))}
        stub = public(methods)
        # Properties are callable-less attributes in the stub (`@property`): compare them too.
        props = {m for m in public(vars(cls)) if isinstance(vars(cls)[m], property)
                 or type(vars(cls)[m]).__name__ == "getset_descriptor"}
        assert real | props == stub, (
            f"{name}: in the extension only: {sorted((real | props) - stub)}; "
            f"in the stub only: {sorted(stub - real - props)}"
        )


def test_the_loader_takes_every_option_of_the_rust_loader_by_its_key() -> None:
    """`dsc.Loader`'s keywords are the Rust loader's keys (`dsc_loader::args::KEYS`, whose Rust
    test holds them equal to its fields and to the flags of `dsc order` and `dsc-train`), with
    PyTorch's `num_threads` for `threads`; a key added in Rust and not here fails this test."""
    import inspect

    from dsc._loader import _KEYWORD

    keywords = set(inspect.signature(dsc.Loader.__init__).parameters)
    wanted = {_KEYWORD.get(k, k) for k in _dsc.LOADER_KEYS}
    assert wanted <= keywords, f"keys dsc.Loader does not take: {sorted(wanted - keywords)}"
    # Every keyword reaches Rust under its key: an unknown key is refused there, by name.
    try:
        _dsc.loader_options('{"bucket_size": 4}', 1)
    except dsc.OptionsError as e:
        assert "bucket_size" in str(e) and "trim_multiple" in str(e), e
    else:
        raise AssertionError("an unknown key was taken")


def test_rust_owns_every_default_of_a_loader(cache_dir) -> None:
    """Issue 54 (2): every `dsc.Loader` keyword that is a Rust key defaults to None and so
    reaches Rust only when given; the docstring's ``[default: V]`` of each is Rust's default
    (`_dsc.LOADER_DEFAULTS`, `LoaderArgs::default()`), and a loader made without them reads
    Rust's back. A default changed in Rust and not in the docstring fails here."""
    import inspect
    import json
    import re

    from dsc._loader import _KEYWORD

    defaults = json.loads(_dsc.LOADER_DEFAULTS)
    assert set(defaults) == set(_dsc.LOADER_KEYS)
    params = inspect.signature(dsc.Loader.__init__).parameters
    restated = {k: params[_KEYWORD.get(k, k)].default for k in _dsc.LOADER_KEYS
                if params[_KEYWORD.get(k, k)].default is not None}
    assert not restated, f"Python restates Rust's defaults: {restated}"
    doc = dsc.Loader.__doc__
    # rank and world_size default from torch.distributed: Python's own rule, documented so.
    for key, value in defaults.items():
        if value is None or isinstance(value, list) or key in ("rank", "world_size"):
            continue
        keyword = _KEYWORD.get(key, key)
        entry = re.search(rf"^        {keyword}: (.*?)(?=^        \w[\w, ]*: |\Z)", doc,
                          re.S | re.M)
        assert entry, f"the docstring has no entry for {keyword}"
        said = re.findall(r"\[default: ([^\]]+)\]", " ".join(entry.group(1).split()))
        assert said == [str(value)], (keyword, said, value)
    loader = dsc.Loader(cache_dir)
    got = dict(split=loader.split, seed=loader.seed, window=loader.window,
               interleave=loader.interleave, shuffle=loader.shuffle,
               drop_last=loader.drop_last, bucket=loader.bucket, batch_size=loader.batch_size,
               epoch=loader.epoch, threads=loader.num_threads, prefetch=loader.prefetch,
               trim=loader.trim)
    assert got == {k: defaults[k] for k in got}


def test_compile_takes_every_key_of_the_rust_spec() -> None:
    """`dsc.compile`'s keywords (`CompileOptions`, checked by `_fields`) are the Rust spec's
    keys (`SPEC_KEYS`, which a Rust test holds equal to `CompileSpec`'s fields), rows being the
    positional argument; a key added to the spec and not here fails this test."""
    import inspect
    import typing

    from dsc._compile import CompileOptions, _fields

    keywords = set(typing.get_type_hints(CompileOptions)) | {"rows"}
    assert set(_dsc.SPEC_KEYS) <= keywords, sorted(set(_dsc.SPEC_KEYS) - keywords)
    assert set(inspect.signature(_fields).parameters) - {"spec"} == keywords
