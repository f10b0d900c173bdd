"""Activate autoteardown for every Python process that has this folder on PYTHONPATH:

    PYTHONPATH=/path/to/sitecustomize_example python train.py

Python imports only the first `sitecustomize` it finds, so this one then runs
the one it shadows (a venv's or the system's), if there is one.
"""

try:
    import autoteardown  # noqa: F401
    from autoteardown.bootstrap import run_shadowed_sitecustomize

    run_shadowed_sitecustomize(__file__)
except Exception as exc:  # never break the interpreter's start
    import sys

    sys.stderr.write(f"autoteardown: not activated: {exc}\n")
