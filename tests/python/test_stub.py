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
