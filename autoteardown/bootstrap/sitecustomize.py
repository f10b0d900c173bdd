# Put on PYTHONPATH by `autoteardown-run`; see autoteardown/bootstrap/__init__.py.
try:
    import autoteardown  # noqa: F401
    from autoteardown.bootstrap import run_shadowed_sitecustomize

    run_shadowed_sitecustomize(__file__)
except Exception as exc:  # never break the interpreter's start
    import sys

    sys.stderr.write(f"autoteardown: not activated: {exc}\n")
