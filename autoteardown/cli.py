"""`autoteardown-run CMD ...`: run CMD with autoteardown active in every Python
process it starts, as `ddtrace-run` and `opentelemetry-instrument` do.

It puts autoteardown's bootstrap sitecustomize first on PYTHONPATH (keeping what
was there) and execs CMD, so the exit status and signals are CMD's own.
"""

import os
import sys

USAGE = "usage: autoteardown-run COMMAND [ARGS...]   e.g. autoteardown-run python train.py"


def bootstrap_dir():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")


def run(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0 if argv else 2
    paths = [bootstrap_dir()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # The bootstrap imports autoteardown, so from a checkout its folder must be
    # importable too. Never add a site-packages: other Pythons would load its packages.
    package_parent = os.path.dirname(os.path.dirname(bootstrap_dir()))
    if os.path.basename(package_parent) not in ("site-packages", "dist-packages") and package_parent not in paths:
        paths.append(package_parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"autoteardown-run: {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127
