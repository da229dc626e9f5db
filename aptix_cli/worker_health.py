"""``aptix worker-health`` and the heartbeat folder ``aptix worker`` prepares (``workers.liveness``).

Imports are deferred into each function: ``aptix worker`` calls :func:`prepare_heartbeats` before a
gevent worker patches the standard library.
"""

from __future__ import annotations

import sys

__all__ = ["check_this_host", "prepare_heartbeats"]


def prepare_heartbeats(names: list[str]) -> bool:
    """Name the worker processes about to start in the heartbeat folder, removing old heartbeats.

    Returns:
        False, having said why on stderr, when the folder cannot be written.
    """
    from shared.settings import get_settings
    from workers.liveness import health_dir, prepare_health_dir

    directory = health_dir(get_settings())
    try:
        prepare_health_dir(directory, names)
    except OSError as exc:
        sys.stderr.write(
            f"aptix worker: cannot keep heartbeats in {directory}: {exc}; set APTIX_WORKER_HEALTH_DIR to a folder "
            "this user may write\n"
        )
        return False
    return True


def check_this_host() -> int:
    """Print one line per worker process of this host's ``aptix worker``; 0 if all are healthy, else 1."""
    from shared.settings import get_settings
    from workers.liveness import check_workers, health_dir

    verdicts = check_workers(health_dir(get_settings()))
    for verdict in verdicts:
        stream = sys.stdout if verdict.ok else sys.stderr
        stream.write(f"{'ok' if verdict.ok else 'FAIL'}: {verdict.message}\n")
    return 0 if all(verdict.ok for verdict in verdicts) else 1
