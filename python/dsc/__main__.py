"""``python -m dsc ARGS``: the ``dsc`` command line, as the console script runs it."""

from dsc._cli import main

main()
