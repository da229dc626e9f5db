"""Child processes of the chaos harness: each in its own session at the checkout, killed by group.

Every process the harness starts comes from :func:`spawn`, an :class:`aptix_cli.launcher.ManagedProcess`
leading a session of its own; the harness ends only those, by their process group id
(``os.killpg``), never by name.
"""

from __future__ import annotations

from pathlib import Path

from aptix_cli.launcher import ManagedProcess

__all__ = ["REPO_ROOT", "spawn"]

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
