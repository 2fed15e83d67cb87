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
