"""What ``/proc`` says of a process (Linux): its children, and whether it still runs."""

from __future__ import annotations

from pathlib import Path

__all__ = ["alive", "children_of"]


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie waiting to be reaped."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
