# For interactive sessions: PYTHONSTARTUP=/path/to/sitecustomize_example/pythonstartup.py python
# Python runs PYTHONSTARTUP only for interactive sessions, never for `python train.py`:
# for scripts use the sitecustomize in this folder or `autoteardown-run`.
import autoteardown  # noqa: F401
