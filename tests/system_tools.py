"""Makes sure the suite has the system tools it runs (Chromium, iptables, faketime); says how to get them if not.

``python -m tests.system_tools`` (``make test`` runs it before the suite) does nothing for a tool
already on PATH. Without one it installs the tool's Debian package where the machine allows it
(running as root, with apt-get), running ``apt-get update`` first only when the install fails. Where
it cannot, it says why and how to install it, and exits 0 all the same: the rest of the suite still
runs. The browser tests (``tests/integration/test_browser.py``) then fail with
:data:`HOW_TO_INSTALL` (a missing browser is never a skip); the network fault test
(``tests/integration/test_chaos.py``, hosts in network namespaces) says it was not run and why, as
it does where it has no root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "CHROMIUM", "EXECUTABLE", "FAKETIME", "HOW_TO_INSTALL", "INSTALL", "IPTABLES", "UPDATE",
    "SystemTool", "ensure_tool",
]  # fmt: skip

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


@dataclass(frozen=True, slots=True)
class SystemTool:
    """An executable the suite runs, the Debian package that brings it, and how to get it elsewhere."""

    executable: str
    """Found on PATH."""
    install: tuple[str, ...]
    """The apt-get command that installs it."""
    how_to_install: str
    """What to say where it cannot be installed here."""


CHROMIUM = SystemTool(EXECUTABLE, INSTALL, HOW_TO_INSTALL)
"""The browser tests' Chromium."""
IPTABLES = SystemTool(
    "iptables",
    ("apt-get", "install", "-y", "-q", "iptables"),
    "the network fault test (hosts in network namespaces) needs `iptables`: `sudo apt-get install iptables` "
    "(`make test` does it by itself when it runs as root and apt-get is there)",
)
"""The network fault test's iptables (tests/chaos/net cuts, slows and drops links with it)."""
FAKETIME = SystemTool(
    "faketime",
    ("apt-get", "install", "-y", "-q", "faketime"),
    "`make chaos-net`'s clock fault needs libfaketime: `sudo apt-get install faketime` (`make test` and "
    "`make chaos-net` do it by themselves when they run as root and apt-get is there)",
)
"""``make chaos-net``'s clock fault (a worker host's clock ahead) runs the worker under libfaketime."""

Which = Callable[[str], str | None]
Run = Callable[[Sequence[str]], int]
Say = Callable[[str], None]


def ensure_tool(tool: SystemTool, *, which: Which, is_root: bool, run: Run, say: Say) -> tuple[bool, str]:
    """Install ``tool`` if it is missing and the machine allows it.

    Args:
        tool: the executable and its package.
        which: finds an executable on PATH (``shutil.which``).
        is_root: whether this process may install system packages.
        run: runs a command and returns its exit status.
        say: tells the person running ``make test`` what is about to happen.

    Returns:
        Whether the executable is on PATH now, and a line saying what was found or done (and, when
        it is still missing, why and how to install it).
    """
    name, how = tool.executable, tool.how_to_install
    if (found := which(name)) is not None:
        return True, f"{name}: {found}"
    if not is_root:
        return False, f"no {name}, and not root, so not installing it: {how}"
    if which("apt-get") is None:
        return False, f"no {name}, and no apt-get to install it with: {how}"
    say(f"no {name} on PATH: installing it with apt-get for the tests that need it")
    # Debian's package lists may be missing or stale on a fresh machine: refresh them only if needed.
    if run(tool.install) != 0 and (run(UPDATE) != 0 or run(tool.install) != 0):
        return False, f"`{' '.join(tool.install)}` failed (its output is above): {how}"
    if (found := which(name)) is None:
        return False, f"apt-get installed {name}, yet no `{name}` is on PATH: {how}"
    return True, f"{name} installed: {found}"


def _run(command: Sequence[str]) -> int:
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(list(command), env=environment, check=False).returncode


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()  # before apt-get's own output


if __name__ == "__main__":
    for needed in (CHROMIUM, IPTABLES, FAKETIME):
        present, said = ensure_tool(needed, which=shutil.which, is_root=os.geteuid() == 0, run=_run, say=_say)
        (sys.stdout if present else sys.stderr).write(said + "\n")
