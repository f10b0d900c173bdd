"""Activate autoteardown for every Python process that has this folder on PYTHONPATH:

    PYTHONPATH=/path/to/sitecustomize_example:/path/to/checkout python train.py

This runs the sitecustomize that ships in the package (one source):
autoteardown/bootstrap/sitecustomize.py; with a pip install use
`PYTHONPATH=$(autoteardown sitecustomize-path)` instead of this folder.
(autoteardown-bootstrap-sitecustomize)
"""

import os as _os

_shipped = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))),
                         "autoteardown", "bootstrap", "sitecustomize.py")
with open(_shipped) as _f:
    exec(compile(_f.read(), _shipped, "exec"))  # runs _activate(__file__) with this file's name
