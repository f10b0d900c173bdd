"""The tests read wandb run files with the library's own reader (autoteardown/cli/wandb_records.py,
which `autoteardown demo` uses too): one reader, one place to follow wandb's format."""

from pathlib import Path

from autoteardown.cli import wandb_records as _reader
from autoteardown.cli.wandb_records import exit_codes, history_steps, run_files  # noqa: F401


def records(path):
    """Every record of one run file. wandb 0.22 leaves an empty file when its wandb-core
    stops before writing anything (a SIGTERM'd run without the shim): no records."""
    if Path(path).stat().st_size == 0:
        return []
    return _reader.records(path)
