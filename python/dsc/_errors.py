"""dsc's exceptions. Every error dsc raises is a :class:`dsc.Error`; each carries where the
problem is, as far as it is known: ``file``, ``column``, ``row`` (0-based within the file),
``key`` (a context key), ``tensor`` and ``sample`` (in a shard). Unknown ones are ``None``."""

from __future__ import annotations

from typing import Any, Optional


class Error(Exception):
    """Base class of every dsc error."""

    def __init__(
        self,
        message: str,
        *,
        file: Optional[str] = None,
        column: Optional[str] = None,
        row: Optional[int] = None,
        key: Optional[str] = None,
        tensor: Optional[str] = None,
        sample: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.column = column
        self.row = row
        self.key = key
        self.tensor = tensor
        self.sample = sample


class CompileError(Error):
    """A compile stopped: bad input (named by file, column and row) or an unwritable output."""


class CacheError(Error):
    """A cache cannot be opened or read: missing, not a cache, corrupt or truncated shards."""


class OptionsError(Error, ValueError):
    """Arguments that do not fit the cache or each other (batch size 0, unknown split, …).
    ``option`` names the keyword argument at fault where one is (``"max_len"``)."""

    def __init__(self, message: str, *, option: Optional[str] = None,
                 raw: Optional[str] = None, **place: Any) -> None:
        super().__init__(message, **place)
        self.option = option
        # The message as the Rust libraries write it, options as `key` in backticks.
        self._raw = raw

    def flags(self) -> str:
        """The message with its options spelled as command-line flags (``--max-seqs``,
        ``--pack 64``, ``--no-shuffle``; the loader's ``threads`` as ``--loader-threads``), by
        the speller dsc's own commands use: for a script whose flags are the loader's keys
        with dashes, as examples/train.py's are."""
        if self._raw is None:
            return str(self)
        from . import _dsc
        return _dsc.spell_flags(self._raw)


class StateError(Error, ValueError):
    """A resume state that does not fit this loader (another cache, seed, split, batch size)."""


class WorkerError(Error, RuntimeError):
    """A loader used in a process it was not made in (a DataLoader worker, a fork), or by two
    threads at once (one iterator at a time)."""


def boolean(name: str, value: Any) -> bool:
    """A keyword that is a flag: ``True`` or ``False`` (NumPy's too), nothing else. ``bool()``
    of anything else lies: ``"False"`` and ``"no"`` are true, ``None`` is false where the
    default may be ``True``."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy"
                                   and type(value).__name__ in ("bool", "bool_")):
        return bool(value)
    raise OptionsError(f"{name}={value!r}: expected True or False", option=name)
