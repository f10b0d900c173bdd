"""python -m autoteardown: the same as the `autoteardown` command (see cli/)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m autoteardown"))
