"""Makes sure the browser tests have their Chromium (Debian's ``chromium``); says how to get it if not.

``python -m tests.browser_check`` (``make test`` runs it before the suite) does nothing when a
``chromium`` is on PATH. Without one it installs Debian's ``chromium`` package where the machine
allows it (running as root, with apt-get), running ``apt-get update`` first only when the install
fails. Where it cannot, it says why and how to install it, and exits 0 all the same: the rest of the
suite still runs, and the browser tests (``tests/integration/test_browser.py``) fail with
:data:`HOW_TO_INSTALL`. A missing browser is never a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence

__all__ = ["EXECUTABLE", "HOW_TO_INSTALL", "INSTALL", "UPDATE", "ensure_chromium"]

EXECUTABLE = "chromium"
"""The browser the tests start (Playwright with ``executable_path``): whatever ``chromium`` PATH finds."""

HOW_TO_INSTALL = (
    "the browser tests need Chromium as `chromium` on PATH. On Debian or Ubuntu: "
    "`sudo apt-get install chromium` (`make test` does it by itself when it runs as root and apt-get "
    "is there); elsewhere install Chromium with the system's package manager so that `chromium` is on PATH"
)
"""What the browser tests and ``make test`` say when there is no Chromium."""

INSTALL = ("apt-get", "install", "-y", "-q", "chromium")
UPDATE = ("apt-get", "update", "-q")

Which = Callable[[str], str | None]
Run = Callable[[Sequence[str]], int]
Say = Callable[[str], None]


def ensure_chromium(*, which: Which, is_root: bool, run: Run, say: Say) -> tuple[bool, str]:
    """Install Chromium if it is missing and the machine allows it.

    Args:
        which: finds an executable on PATH (``shutil.which``).
        is_root: whether this process may install system packages.
        run: runs a command and returns its exit status.
        say: tells the person running ``make test`` what is about to happen.

    Returns:
        Whether ``chromium`` is on PATH now, and a line saying what was found or done (and, when
        it is still missing, why and how to install it).
    """
    if (found := which(EXECUTABLE)) is not None:
        return True, f"Chromium: {found}"
    if not is_root:
        return False, f"no Chromium, and not root, so not installing it: {HOW_TO_INSTALL}"
    if which("apt-get") is None:
        return False, f"no Chromium, and no apt-get to install it with: {HOW_TO_INSTALL}"
    say("no Chromium on PATH: installing Debian's chromium with apt-get for the browser tests")
    # Debian's package lists may be missing or stale on a fresh machine: refresh them only if needed.
    if run(INSTALL) != 0 and (run(UPDATE) != 0 or run(INSTALL) != 0):
        return False, f"`{' '.join(INSTALL)}` failed (its output is above): {HOW_TO_INSTALL}"
    if (found := which(EXECUTABLE)) is None:
        return False, f"apt-get installed chromium, yet no `chromium` is on PATH: {HOW_TO_INSTALL}"
    return True, f"Chromium installed: {found}"


def _run(command: Sequence[str]) -> int:
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(list(command), env=environment, check=False).returncode


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()  # before apt-get's own output


if __name__ == "__main__":
    present, said = ensure_chromium(which=shutil.which, is_root=os.geteuid() == 0, run=_run, say=_say)
    (sys.stdout if present else sys.stderr).write(said + "\n")
