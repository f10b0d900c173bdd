"""Activate autoteardown for every Python process that has this folder on PYTHONPATH:

    PYTHONPATH=/path/to/sitecustomize_example python train.py

Python imports only the first `sitecustomize` module it finds, so this one
then runs the one it shadows (a venv's or the system's), if there is one.
"""

import importlib.machinery
import importlib.util
import os
import sys

try:
    import autoteardown  # noqa: F401
except Exception as exc:  # never break the interpreter's start
    sys.stderr.write(f"autoteardown: not activated: {exc}\n")


def _run_shadowed_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


_run_shadowed_sitecustomize()
