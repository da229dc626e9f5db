"""CPU accounting over named groups of processes, read from ``/proc/<pid>/stat``.

A group is a set of processes found at each sample: a process the bench started with all its
descendants (the gateway; each ``aptix worker`` with its Celery workers and their pool children),
or processes found some other way (redis-server by the pid ``INFO`` gives, PostgreSQL's server
processes). CPU is ``utime + stime``, in clock ticks (``SC_CLK_TCK``), summed over all threads by
the kernel.

For a tree, the CPU of descendants that ended and were reaped inside the tree is in their reaper's
``cutime + cstime``, so a tree counts those too and its figure is the sum over the tree at the second
sample minus the sum at the first. The trees are the processes the bench started, and PostgreSQL:
its backends are the postmaster's children, and a pool that opens a connection under load and closes
it when it is returned ends backends all through a run (the worker processes' overflow connection:
before the postmaster was counted as a tree, their CPU was lost, about 4 ms of a turn's at 200 ms
model latency). For the other groups (redis-server, which reaps children that are none of the
bench's business: its background saves) each process counts only its own time, from the first sample
(or from zero for a process that appeared between the samples); a process that ended between the
samples is lost.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CpuMeter",
    "CpuSample",
    "Group",
    "ProcStat",
    "ProcessTable",
    "cpu_seconds",
    "descendants",
    "memory_kib",
    "parse_stat",
    "queues_arg",
    "read_processes",
    "rss_bytes",
    "serving",
]


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of one ``/proc/<pid>/stat`` line the bench uses (times in clock ticks)."""

    pid: int
    comm: str
    ppid: int
    utime: int
    stime: int
    cutime: int
    """CPU of reaped children, user mode."""
    cstime: int
    """CPU of reaped children, kernel mode."""
    starttime: int
    """Ticks after boot the process started: with the pid, it names the process (pids are reused)."""
    rss_pages: int

    def ticks(self, *, with_children: bool) -> int:
        """CPU used so far, with the reaped children's when ``with_children``."""
        own = self.utime + self.stime
        return own + self.cutime + self.cstime if with_children else own


ProcessTable = Mapping[int, ProcStat]
"""Every readable process by pid."""


@dataclass(frozen=True, slots=True)
class Group:
    """A named set of processes whose CPU is counted together."""

    name: str
    members: Callable[[ProcessTable], Collection[int]]
    """The group's pids, given the process table of the sample."""
    tree: bool
    """Whether the members are a tree whose reaped children count (see the module)."""


CpuSample = dict[str, dict[tuple[int, int], int]]
"""Group name -> (pid, starttime) -> CPU ticks."""


class CpuMeter:
    """Samples the CPU of some groups; :func:`cpu_seconds` turns two samples into seconds per group."""

    def __init__(self, groups: Sequence[Group]) -> None:
        self.groups = tuple(groups)

    def sample(self) -> CpuSample:
        """Read every group's CPU now."""
        table = read_processes()
        return {
            group.name: {
                (pid, table[pid].starttime): table[pid].ticks(with_children=group.tree)
                for pid in group.members(table)
                if pid in table
            }
            for group in self.groups
        }

    def used(self, before: CpuSample, after: CpuSample) -> dict[str, float]:
        """CPU seconds each group used between two samples."""
        return cpu_seconds(before, after, trees={group.name for group in self.groups if group.tree})


def cpu_seconds(
    before: CpuSample, after: CpuSample, *, trees: Collection[str] = (), ticks_per_second: int | None = None
) -> dict[str, float]:
    """CPU seconds each group used between two samples.

    Args:
        before: the first sample.
        after: the second sample.
        trees: the groups counted as trees (sum after minus sum before); the others count each
            process present at ``after`` from its ``before`` value, or from zero.
        ticks_per_second: clock ticks per second; ``SC_CLK_TCK`` when None.

    Returns:
        Seconds by group name, for every group of ``after``.
    """
    hertz = ticks_per_second or os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for name, now in after.items():
        then = before.get(name, {})
        if name in trees:
            ticks = sum(now.values()) - sum(then.values())
        else:
            ticks = sum(value - then.get(key, 0) for key, value in now.items())
        used[name] = max(ticks, 0) / hertz
    return used


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line.

    The command name is in parentheses and may hold spaces and parentheses itself, so the fields
    are counted from the last ``)``.

    Raises:
        ValueError: the line is not a stat line.
    """
    head, close, tail = text.rpartition(")")
    pid_text, open_paren, comm = head.partition("(")
    fields = tail.split()
    if not close or not open_paren or len(fields) < 22:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    # fields[0] is field 3 of proc(5) (state), so field n is fields[n - 3].
    return ProcStat(
        pid=int(pid_text),
        comm=comm,
        ppid=int(fields[1]),
        utime=int(fields[11]),
        stime=int(fields[12]),
        cutime=int(fields[13]),
        cstime=int(fields[14]),
        starttime=int(fields[19]),
        rss_pages=int(fields[21]),
    )


def read_processes(proc: Path = Path("/proc")) -> dict[int, ProcStat]:
    """Every process whose stat can be read now, by pid (a process that ends meanwhile is left out)."""
    table: dict[int, ProcStat] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            table[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError):
            continue
    return table


def descendants(table: ProcessTable, roots: Iterable[int]) -> set[int]:
    """``roots`` (those that are in ``table``) and every process below them."""
    children: dict[int, list[int]] = {}
    for stat in table.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found: set[int] = set()
    pending = [pid for pid in roots if pid in table]
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending.extend(children.get(pid, ()))
    return found


def serving(table: ProcessTable, roots: Iterable[int], queues: str) -> set[int]:
    """The Celery workers under ``roots`` whose command line gives exactly ``queues``, with their children."""
    workers = [pid for pid in descendants(table, roots) if queues_arg(_cmdline(pid)) == queues]
    return descendants(table, workers)


def queues_arg(argv: Sequence[str]) -> str | None:
    """The value of ``-Q``/``--queues`` in a command line (None when it has none)."""
    for index, arg in enumerate(argv):
        if arg in ("-Q", "--queues") and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--queues="):
            return arg.removeprefix("--queues=")
    return None


def rss_bytes(table: ProcessTable, pids: Iterable[int]) -> int:
    """The summed resident set of ``pids`` (shared pages count once per process)."""
    page = os.sysconf("SC_PAGE_SIZE")
    return sum(table[pid].rss_pages * page for pid in pids if pid in table)


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (its peak) of the process, in KiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0])
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
