"""The directory where the processes of one ``aptix worker`` count their metrics.

They count in prometheus_client's multiprocess mode (the design is in :mod:`workers.metrics`):
each process writes memory-mapped files of its own into the directory named by
``PROMETHEUS_MULTIPROC_DIR``, which prometheus_client reads when it is first imported. So this
module imports nothing of it: :func:`prepare_directory` runs first, then
:mod:`aptix_cli.metrics_export` serves the files.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["MULTIPROC_ENV", "pid_alive", "prepare_directory"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""The variable prometheus_client reads (at import) to count in files of that directory."""
_PREFIX = "aptix-metrics-"


def prepare_directory(base: Path | None = None) -> Path:
    """Make a fresh directory for this process's metric files and name it in ``PROMETHEUS_MULTIPROC_DIR``.

    Processes started from here on inherit the variable. Directories left by earlier ones (killed
    before they could remove their own) are removed, unless their process still runs: no count of
    an earlier run is ever added in.

    Args:
        base: where to make it (default: the temporary directory, ``TMPDIR``).

    Returns:
        The new directory.

    Raises:
        RuntimeError: prometheus_client was imported already: this process would not count in files.
    """
    if "prometheus_client" in sys.modules:
        raise RuntimeError("prepare_directory() must run before prometheus_client is imported")
    base = base or Path(tempfile.gettempdir())
    for stale in base.glob(f"{_PREFIX}*"):
        owner = stale.name[len(_PREFIX) :].split("-", 1)[0]
        # A container restarted with the same pid numbering may find its own pid on an old directory.
        if owner.isdigit() and (int(owner) == os.getpid() or not pid_alive(int(owner))):
            shutil.rmtree(stale, ignore_errors=True)
    path = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base))
    os.environ[MULTIPROC_ENV] = str(path)
    return path


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a signal 0 probe)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
