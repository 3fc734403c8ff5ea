"""`python -m sessionizer ...`: the command line, with the same flags and output as the
`sessionizer` binary (run, generate, inspect), in this interpreter's process. Ctrl-C
stops a run between two batches, as SIGINT stops the binary; a second one ends the
process at once."""

import sys

from sessionizer import _native


def entry() -> None:
    """The console script `sessionizer` and `python -m sessionizer`."""
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(_native.main(["sessionizer", *sys.argv[1:]]))


if __name__ == "__main__":
    entry()
