"""The sitecustomize that activates autoteardown in every Python process with this folder
on PYTHONPATH (`autoteardown run`, `autoteardown sitecustomize-path`)."""
