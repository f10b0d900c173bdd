"""Activate autoteardown in every Python process that has this folder on PYTHONPATH
(autoteardown-bootstrap-sitecustomize: the marker that tells our copies apart):

    PYTHONPATH=$(autoteardown sitecustomize-path) python train.py

Python imports only the first `sitecustomize`, so this one then runs the one it shadows,
if any, and reports an error in it as site.py would. Stdlib only until autoteardown is
imported, so the shadowed one runs even if autoteardown cannot be imported.
"""


def _activate(own_file):
    import os
    import sys

    own = os.path.abspath(own_file)
    try:
        import autoteardown  # noqa: F401
    except Exception as exc:  # never break the interpreter's start
        sys.stderr.write(f"autoteardown: not activated: {type(exc).__name__}: {exc} "
                         f"(sitecustomize in {os.path.dirname(own)})\n")
    import importlib.machinery
    import importlib.util

    for entry in sys.path:
        try:
            spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry or os.curdir])
        except Exception:
            continue
        if spec is None or spec.loader is None or not spec.origin or os.path.abspath(spec.origin) == own:
            continue
        try:
            with open(spec.origin, "rb") as f:
                if b"autoteardown-bootstrap-sitecustomize" in f.read():
                    continue  # another copy of this one (the example folder): never loop
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as err:  # yours, not autoteardown's: reported as site.py does
            if sys.flags.verbose:
                sys.excepthook(*sys.exc_info())
            else:
                sys.stderr.write(f"Error in sitecustomize ({spec.origin}); set PYTHONVERBOSE for traceback:\n"
                                 f"{type(err).__name__}: {err}\n")
        return


_activate(__file__)
