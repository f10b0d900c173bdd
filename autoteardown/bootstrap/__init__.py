"""Activation without touching the script: `autoteardown run` puts this folder, whose
`sitecustomize.py` imports autoteardown, on PYTHONPATH (`sitecustomize_example/` runs
the same file)."""

import os

FOLDER = os.path.dirname(os.path.abspath(__file__))


def pythonpath_entries():
    """What PYTHONPATH needs: this folder, and the one holding the package unless it is a
    site-packages (other Pythons would load its packages)."""
    entries = [FOLDER]
    package_parent = os.path.dirname(os.path.dirname(FOLDER))
    if os.path.basename(package_parent) not in ("site-packages", "dist-packages"):
        entries.append(package_parent)
    return entries
