"""What the scripts see of another process. A pid can end between two psutil calls
(`pid_exists()` then `Process(pid)`), so each question is asked once and a process
gone meanwhile is an answer, not an error."""

import psutil


def running(pid):
    """Is `pid` still running? A zombie has ended; a pid gone at any point has too."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
