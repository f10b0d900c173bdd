"""Activate autoteardown in every Python process that has this folder on PYTHONPATH
(autoteardown-bootstrap-sitecustomize: the marker that tells our copies apart):

    PYTHONPATH=$(autoteardown sitecustomize-path) python train.py

`autoteardown run` does the same for you. Python imports only the first
`sitecustomize` it finds, so this one then runs the one it shadows (a venv's or
the system's), if there is one; an error in that one is reported as Python
reports it, naming its file, and does not stop the interpreter's start.
Stdlib only until autoteardown is imported, so the shadowed one runs even if
autoteardown cannot be imported.
"""


def _activate(own_file):
    import os
    import sys

    try:
        import autoteardown  # noqa: F401
    except Exception as exc:  # never break the interpreter's start
        sys.stderr.write(f"autoteardown: not activated: {type(exc).__name__}: {exc} "
                         f"(sitecustomize in {os.path.dirname(os.path.abspath(own_file))})\n")
    _run_shadowed(own_file)


def _run_shadowed(own_file):
    import importlib.machinery
    import importlib.util
    import os
    import sys

    own = os.path.abspath(own_file)
    for entry in sys.path:
        try:
            spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry or os.curdir])
        except Exception:
            continue
        if spec is None or spec.loader is None or not spec.origin:
            continue
        if os.path.abspath(spec.origin) == own:
            continue
        try:
            with open(spec.origin, "rb") as f:
                if b"autoteardown-bootstrap-sitecustomize" in f.read():
                    continue  # another copy of this one (the example folder): never loop
        except OSError:
            pass
        try:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as err:
            # As site.py reports an error in a sitecustomize: it is yours, not autoteardown's.
            if sys.flags.verbose:
                sys.excepthook(*sys.exc_info())
            else:
                sys.stderr.write(f"Error in sitecustomize ({spec.origin}); set PYTHONVERBOSE for traceback:\n"
                                 f"{type(err).__name__}: {err}\n")
        return


_activate(__file__)
