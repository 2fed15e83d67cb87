"""The ``dsc`` console script a pip install puts on the PATH: the same command line as the
cargo-built ``dsc`` binary (the Rust CLI, linked into the extension), run in this process."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    # Python turns SIGINT into KeyboardInterrupt, checked only between bytecodes: the Rust
    # command never returns to it, so Ctrl-C must act as it does on the binary (the commands
    # that clean up install their own handlers; the rest stop at once).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from dsc import _dsc

    # "dsc" whatever started it (the console script, or `python -m dsc`), as usage lines say.
    sys.exit(_dsc.cli(["dsc", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
