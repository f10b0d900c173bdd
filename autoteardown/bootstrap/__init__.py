"""Activation without touching the script.

This folder holds a `sitecustomize.py`; `autoteardown-run` puts the folder on
PYTHONPATH so that every Python process it starts (and their Python children)
imports autoteardown first. Python imports only the first `sitecustomize` it
finds, so ours then runs the one it shadows (a venv's or the system's).
"""

import importlib.machinery
import importlib.util
import os
import sys

_visited = set()  # our own sitecustomize folders, so that chained ones never loop


def run_shadowed_sitecustomize(own_file):
    _visited.add(os.path.dirname(os.path.abspath(own_file)))
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) in _visited:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return
