"""Activation without touching the script.

This folder holds a `sitecustomize.py`; `autoteardown run` puts the folder on
PYTHONPATH (and `autoteardown sitecustomize-path` prints what to put there) so
that every Python process started with it (and their Python children) imports
autoteardown first. That file is stdlib-only until it imports autoteardown, and
then runs the `sitecustomize` it shadows. `sitecustomize_example/` in the
source tree runs this same file.
"""

import os

FOLDER = os.path.dirname(os.path.abspath(__file__))


def pythonpath_entries():
    """What PYTHONPATH needs for the bootstrap: its folder, and the folder holding the
    autoteardown package when that is not a site-packages (a checkout). Never a
    site-packages: other Pythons would load its packages."""
    entries = [FOLDER]
    package_parent = os.path.dirname(os.path.dirname(FOLDER))
    if os.path.basename(package_parent) not in ("site-packages", "dist-packages"):
        entries.append(package_parent)
    return entries
