"""The workers' metrics listener: one per ``aptix worker`` (or ``aptix reconciler``), serving the sum
of what every process it started counted.

Each process counts in files of its own in one directory (:mod:`aptix_cli.metrics_dir`, and the
design in :mod:`workers.metrics`). :class:`MultiProcessListener` serves their sum on
``APTIX_WORKER_METRICS_HOST``:``APTIX_WORKER_METRICS_PORT`` and removes the directory when it
stops. At each scrape it first folds the files of processes that died into one file per kind
(:func:`fold_dead_processes`), so their counts stay in the sums and the files do not pile up.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from aptix_cli.metrics_dir import pid_alive
from shared.metrics_server import MetricsServer

__all__ = ["MultiProcessListener", "fold_dead_processes"]

_ARCHIVE = "dead"
"""The pid part of the file that holds the folded counts of dead processes (``counter_dead.db``)."""


class MultiProcessListener(MetricsServer):
    """Serves ``/metrics``: the sum of the metric files in one directory, over HTTP on a thread."""

    def __init__(self, directory: Path, *, host: str, port: int) -> None:
        """Prepare the listener; nothing listens until :meth:`start`.

        Args:
            directory: the metric files' directory (:func:`aptix_cli.metrics_dir.prepare_directory`).
            host: the address to listen on.
            port: the port to listen on.
        """
        registry = CollectorRegistry()
        registry.register(_FoldingCollector(directory))
        super().__init__(registry, host=host, port=port)
        self.directory = directory

    def stop(self) -> None:
        """Stop listening and remove the directory."""
        super().stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def fold_dead_processes(directory: Path, *, alive: Callable[[int], bool] = pid_alive) -> int:
    """Fold the metric files of processes that are gone into one file per kind (``counter_dead.db``, ...).

    Counters and histograms keep their counts (added into the kind's file of dead processes);
    ``live*`` gauges of a dead process are dropped, as prometheus_client's ``mark_process_dead``
    does; other gauges are left as they are. The caller makes sure no two folds run at once.

    Args:
        directory: the metric files' directory.
        alive: whether a pid runs.

    Returns:
        How many files were folded or dropped.
    """
    folded = 0
    for path in sorted(directory.glob("*.db")):
        kind, _, pid = path.stem.rpartition("_")
        if not pid.isdigit() or alive(int(pid)) or (kind.startswith("gauge") and not kind.startswith("gauge_live")):
            continue
        if not kind.startswith("gauge"):
            _add_into(directory / f"{kind}_{_ARCHIVE}.db", path)
        path.unlink()
        folded += 1
    return folded


# prometheus_client's mmap_dict and multiprocess modules carry no annotations: hence the ignores below.


def _add_into(archive_path: Path, path: Path) -> None:
    """Add every value of the metric file ``path`` into the one at ``archive_path`` (made if missing)."""
    entries = MmapedDict.read_all_values_from_file(str(path))  # type: ignore[no-untyped-call]  # untyped upstream
    archive = MmapedDict(str(archive_path))  # type: ignore[no-untyped-call]  # untyped upstream
    try:
        for key, value, _timestamp, _position in entries:
            total, _ = archive.read_value(key)  # type: ignore[no-untyped-call]  # untyped upstream
            archive.write_value(key, total + value, 0.0)  # type: ignore[no-untyped-call]  # untyped upstream
    finally:
        archive.close()  # type: ignore[no-untyped-call]  # untyped upstream


class _FoldingCollector(Collector):
    """prometheus_client's MultiProcessCollector, after folding the files of dead processes."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._lock = threading.Lock()  # one scrape at a time: a fold must not run twice over a file

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            fold_dead_processes(self._directory)
            collector = MultiProcessCollector(None, path=str(self._directory))  # type: ignore[no-untyped-call]  # untyped upstream
            return list(collector.collect())  # type: ignore[no-untyped-call]  # untyped upstream
