"""``make test`` sets up the system tools the suite runs itself (tests/system_tools.py): it installs
Debian's ``chromium`` and ``iptables`` where the machine allows it and says how where it does not. A
fake PATH and a fake apt-get stand in for the machine; nothing here installs anything."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.system_tools import CHROMIUM, EXECUTABLE, HOW_TO_INSTALL, INSTALL, IPTABLES, UPDATE, ensure_tool


@dataclass
class Machine:
    """A PATH and an apt-get: an install puts its package on PATH unless its exit statuses say it failed."""

    path: dict[str, str] = field(default_factory=lambda: {"apt-get": "/usr/bin/apt-get"})
    statuses: dict[tuple[str, ...], list[int]] = field(default_factory=dict)
    ran: list[tuple[str, ...]] = field(default_factory=list)
    said: list[str] = field(default_factory=list)

    def which(self, name: str) -> str | None:
        return self.path.get(name)

    def run(self, command: Sequence[str]) -> int:
        self.ran.append(tuple(command))
        queued = self.statuses.get(tuple(command))
        status = queued.pop(0) if queued else 0
        if tuple(command[:2]) == ("apt-get", "install") and status == 0:
            self.path[command[-1]] = f"/usr/bin/{command[-1]}"
        return status

    def ensure(self, *, is_root: bool = True) -> tuple[bool, str]:
        return ensure_tool(CHROMIUM, which=self.which, is_root=is_root, run=self.run, say=self.said.append)


def test_system_tools_does_nothing_when_chromium_is_on_path() -> None:
    machine = Machine(path={EXECUTABLE: "/usr/bin/chromium", "apt-get": "/usr/bin/apt-get"})
    present, said = machine.ensure(is_root=True)
    assert present and "/usr/bin/chromium" in said
    assert machine.ran == [] and machine.said == []


def test_system_tools_installs_chromium_as_root_with_apt_get() -> None:
    machine = Machine()
    present, said = machine.ensure(is_root=True)
    assert present and said == "chromium installed: /usr/bin/chromium"
    assert machine.ran == [INSTALL]
    assert machine.said, "it says what it is about to do before apt-get speaks"


def test_system_tools_refreshes_the_package_lists_only_when_the_install_fails() -> None:
    # Given a fresh machine whose package lists do not know chromium yet
    machine = Machine(statuses={INSTALL: [100, 0]})
    # When the check runs as root
    present, _ = machine.ensure(is_root=True)
    # Then it installs after apt-get update, as .ci/run always did
    assert present
    assert machine.ran == [INSTALL, UPDATE, INSTALL]


def test_system_tools_says_how_to_install_when_not_root() -> None:
    machine = Machine()
    present, said = machine.ensure(is_root=False)
    assert not present
    assert "not root" in said and HOW_TO_INSTALL in said
    assert machine.ran == []


def test_system_tools_says_how_to_install_when_there_is_no_apt_get() -> None:
    machine = Machine(path={})
    present, said = machine.ensure(is_root=True)
    assert not present
    assert "no apt-get" in said and HOW_TO_INSTALL in said
    assert machine.ran == []


def test_system_tools_says_how_to_install_when_apt_get_fails() -> None:
    machine = Machine(statuses={INSTALL: [100, 100]})
    present, said = machine.ensure(is_root=True)
    assert not present
    assert "failed" in said and HOW_TO_INSTALL in said
    assert machine.ran == [INSTALL, UPDATE, INSTALL]


def test_system_tools_message_says_how_to_install_chromium() -> None:
    # The browser tests fail with this message when Chromium is missing: it must say how to get it.
    assert "apt-get install chromium" in HOW_TO_INSTALL and "make test" in HOW_TO_INSTALL


def test_iptables_is_installed_the_same_way_for_the_network_fault_test() -> None:
    machine = Machine()
    present, said = ensure_tool(IPTABLES, which=machine.which, is_root=True, run=machine.run, say=machine.said.append)
    assert present and said == "iptables installed: /usr/bin/iptables"
    assert machine.ran == [IPTABLES.install] and IPTABLES.install[-1] == "iptables"
    missing, how = ensure_tool(IPTABLES, which=Machine(path={}).which, is_root=True, run=machine.run, say=print)
    assert not missing and "no apt-get" in how and "apt-get install iptables" in how
