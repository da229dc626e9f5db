"""Child processes of the chaos harness: each in its own session at the checkout, killed by group.

Every process the harness starts comes from :func:`spawn`, an :class:`aptix_cli.launcher.ManagedProcess`
leading a session of its own; the harness ends only those, by their process group id
(``os.killpg``), and with :func:`kill_tree` also every descendant by its pid (a child that started a
session of its own is in no group of ours), never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from aptix_cli.launcher import ManagedProcess

__all__ = ["REPO_ROOT", "descendants", "kill_tree", "spawn"]

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout: every child runs here, so ``tests.support.tools`` imports as an operator tool."""


def spawn(name: str, argv: list[str], *, env: dict[str, str], log_dir: Path) -> ManagedProcess:
    """Start ``argv`` in a session of its own at :data:`REPO_ROOT`, logged to ``<log_dir>/<name>.log``.

    Args:
        name: Unique within the fault (the log file's stem).
        argv: The command.
        env: Its whole environment.
        log_dir: The fault's folder.

    Returns:
        The process; its ``kill()`` SIGKILLs its whole process group.
    """
    return ManagedProcess(name, argv, env, log_dir, cwd=REPO_ROOT, own_session=True)


def descendants(pid: int) -> list[int]:
    """The pids of every live descendant of ``pid`` (read from ``/proc``; [] where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name (field 2) may hold spaces: the parent pid is the 2nd field after its ")".
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    pending = list(children.get(pid, []))
    while pending:
        child = pending.pop()
        found.append(child)
        pending += children.get(child, [])
    return found


def kill_tree(process: ManagedProcess) -> None:
    """SIGKILL ``process``'s group, then each descendant it had (by pid) that lives on in a session of its own."""
    tree = descendants(process.pid) if process.alive() else []
    process.kill()
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):  # ended with the group
            os.kill(pid, signal.SIGKILL)
