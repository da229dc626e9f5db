"""The bench's printed figures: aligned plain-text lines on stdout (progress goes to stderr)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TextIO

from aptix_cli.bench.measure import ChainResult, TurnResult
from aptix_cli.bench.peers import PeerResult
from aptix_cli.bench.server_stats import ServerFigures
from aptix_cli.bench.stats import RunFigures
from aptix_cli.progress import STATUS_ORDER

__all__ = [
    "Report",
    "chain_lines",
    "comparison_table",
    "cpu_cells",
    "latency_cell",
    "peer_lines",
    "peers_table",
    "ratio",
    "server_lines",
    "statuses_cell",
    "turn_lines",
]

_LABEL_WIDTH = 25
_PEER_TOTAL_OF = ("peer", "postgres")
"""A peer's CPU groups: its process tree; PostgreSQL's server processes and the peer database's backends."""


class Report:
    """Writes lines to a stream, flushing each (the run is long; show figures as they come)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def line(self, text: str = "") -> None:
        """One line as is."""
        self._stream.write(text + "\n")
        self._stream.flush()

    def field(self, label: str, value: str) -> None:
        """``  label:  value`` with the values aligned."""
        self.line(_field(label, value))

    def lines(self, texts: Sequence[str]) -> None:
        """Several lines."""
        for text in texts:
            self.line(text)


def turn_lines(
    result: TurnResult, *, total_of: Sequence[str], apart: Sequence[str], by_queues: Sequence[str] = ()
) -> list[str]:
    """The block of one scenario's Aptix figures."""
    run, hops = result.run, result.hops
    scenario = run.scenario
    if hops.common is None:
        hop_text = "unknown (no sampled turn's state was found)"
    else:
        count = f"{hops.mean:g}" if hops.mean == len(hops.common.tasks) else f"{hops.mean:.2f} on average"
        hop_text = f"{count} ({hops.sampled} sampled turns; {hops.common.describe()})"
    return [
        f"{scenario.name} ({scenario.description}): {run.submitted.turns} turns in one batch",
        _field("hops per turn", hop_text),
        _field("throughput", _throughput(run.figures, "turns", "from submitting to the last turn completed")),
        _field("latency p50/p95/p99", latency_cell(run.figures) + " (created to completed)"),
        _field("CPU per turn, ms", cpu_cells(result.cpu_ms, total_of=total_of, apart=apart)),
        *_by_queues_lines(result.cpu_ms, by_queues),
        *server_lines(result.servers),
        _field("statuses", statuses_cell(run.statuses)),
    ]


def server_lines(figures: ServerFigures | None) -> list[str]:
    """Per turn, each Redis server's commands (the most called with their share) and CPU, and PostgreSQL's
    transactions, by the servers' own counters (``INFO``, ``pg_stat_database``)."""
    if figures is None:
        return []
    lines = []
    for role, (commands, cpu_ms, most) in figures.redis.items():
        top = ", ".join(f"{name} {count:.1f}" for name, count in most.items())
        lines.append(_field(f"Redis {role}", f"per turn {commands:.1f} commands ({top}), CPU {cpu_ms:.2f} ms"))
    if figures.pg_commits is not None:
        rollbacks = f", {figures.pg_rollbacks:.2f} rolled back" if figures.pg_rollbacks else ""
        lines.append(_field("PostgreSQL", f"per turn {figures.pg_commits:.2f} transactions committed{rollbacks}"))
    return lines


def chain_lines(name: str, result: ChainResult, *, total_of: Sequence[str], by_queues: Sequence[str] = ()) -> list[str]:
    """The block of one bare-chain run."""
    hops = len(result.hops.tasks)
    return [
        f"{name}: {result.chains} chains of {hops} hop{'s' * (hops != 1)} ({' > '.join(result.hops.queues)})",
        _field("throughput", _throughput(result.figures, "chains", "from sending the first to the last finished")),
        _field("latency p50/p95/p99", latency_cell(result.figures) + " (sent to last hop)"),
        _field("CPU per chain, ms", cpu_cells(result.cpu_ms, total_of=total_of, apart=())),
        *_by_queues_lines(result.cpu_ms, by_queues),
        _field("finished", f"{result.figures.count} of {result.chains}"),
    ]


def comparison_table(
    rows: Sequence[tuple[str, TurnResult, ChainResult]], *, total_of: Sequence[str], bare_total_of: Sequence[str]
) -> list[str]:
    """Aptix against the bare chain, one row per scenario."""
    header = ["scenario", "hops", "turns/s", "chains/s", "speed", "CPU/turn ms", "CPU/chain ms", "CPU ratio"]
    header.append("w/o gateway")
    body = []
    for name, turns, chains in rows:
        turn_cpu = _total(turns.cpu_ms, total_of)
        chain_cpu = _total(chains.cpu_ms, bare_total_of)
        without_gateway = _total(turns.cpu_ms, [group for group in total_of if group != "gateway"])
        body.append(
            (
                name,
                str(len(chains.hops.tasks)),
                f"{turns.run.figures.rate:.1f}",
                f"{chains.figures.rate:.1f}",
                ratio(turns.run.figures.rate, chains.figures.rate),
                f"{turn_cpu:.2f}",
                f"{chain_cpu:.2f}",
                ratio(turn_cpu, chain_cpu),
                ratio(without_gateway, chain_cpu),
            )
        )
    return _table(header, body)


def peer_lines(result: PeerResult) -> list[str]:
    """The block of one durable peer's run."""
    wall = f"{result.seconds:.1f} s from the first turn started to the last ended"
    return [
        f"{result.peer.title}: {result.turns} server-tool turns in one process",
        _field("throughput", f"{result.rate:.1f} turns/s ({wall})"),
        _field("CPU per turn, ms", cpu_cells(result.cpu_ms, total_of=_PEER_TOTAL_OF, apart=())),
        _field("completed", f"{result.completed} of {result.turns}"),
    ]


def peers_table(
    aptix: TurnResult,
    chains: ChainResult,
    peers: Sequence[PeerResult],
    *,
    total_of: Sequence[str],
    bare_total_of: Sequence[str],
) -> list[str]:
    """The server-tool turn in Aptix, the bare chain and each peer: turns/s and CPU per turn, with ratios."""
    aptix_cpu = _total(aptix.cpu_ms, total_of)
    chain_cpu = _total(chains.cpu_ms, bare_total_of)
    systems = [
        ("Aptix", aptix.run.figures.rate, aptix_cpu, aptix.cpu_ms.get("postgres")),
        ("bare Celery chain", chains.figures.rate, chain_cpu, None),
        *(
            (peer.peer.title, peer.rate, _total(peer.cpu_ms, _PEER_TOTAL_OF), peer.cpu_ms.get("postgres"))
            for peer in peers
        ),
    ]
    header = ["system", "turns/s", "speed vs Aptix", "CPU/turn ms", "of it postgres", "vs Aptix", "vs bare chain"]
    body = [
        (
            name,
            f"{rate:.1f}",
            ratio(rate, aptix.run.figures.rate),
            f"{cpu:.2f}",
            _ms(postgres),
            ratio(cpu, aptix_cpu),
            ratio(cpu, chain_cpu),
        )
        for name, rate, cpu, postgres in systems
    ]
    return _table(header, body)


def cpu_cells(cpu_ms: Mapping[str, float | None], *, total_of: Sequence[str], apart: Sequence[str]) -> str:
    """``gateway 1.20 | workers 15.31 | ... | total 23.10`` (n/a for a group not on this machine)."""
    cells = [f"{name} {_ms(cpu_ms.get(name))}" for name in total_of]
    cells.append(f"total {_total(cpu_ms, total_of):.2f}")
    cells += [f"{name} {_ms(cpu_ms.get(name))} (not in the total)" for name in apart]
    return " | ".join(cells)


def latency_cell(figures: RunFigures) -> str:
    """``p50 / p95 / p99 ms``."""
    return " / ".join(_ms(value * 1000, digits=0) for value in (figures.p50, figures.p95, figures.p99)) + " ms"


def statuses_cell(statuses: Mapping[str, int]) -> str:
    """``completed 500`` (finished statuses first)."""
    order: list[str] = [status for status in STATUS_ORDER if statuses.get(status)]
    order += sorted(status for status in statuses if status not in STATUS_ORDER and statuses[status])
    return ", ".join(f"{status} {statuses[status]}" for status in order) or "none"


def ratio(numerator: float, denominator: float) -> str:
    """``6.4x`` (``n/a`` when the denominator is zero)."""
    return f"{numerator / denominator:.2f}x" if denominator > 0 else "n/a"


def _by_queues_lines(cpu_ms: Mapping[str, float | None], queues: Sequence[str]) -> list[str]:
    """The workers' CPU split by the Celery worker (queue group) it was spent in; the rest is supervisors."""
    if not queues:
        return []
    rest = (cpu_ms.get("workers") or 0.0) - _total(cpu_ms, queues)
    cells = " | ".join(f"{name} {_ms(cpu_ms.get(name))}" for name in queues)
    return [_field("workers by queue, ms", f"{cells} | rest {rest:.2f}")]


def _field(label: str, value: str) -> str:
    return f"  {label + ':':<{_LABEL_WIDTH}}{value}"


def _throughput(figures: RunFigures, unit: str, span: str) -> str:
    return f"{figures.rate:.1f} {unit}/s ({figures.elapsed:.1f} s {span})"


def _total(cpu_ms: Mapping[str, float | None], names: Sequence[str]) -> float:
    return sum(cpu_ms.get(name) or 0.0 for name in names)


def _ms(value: float | None, *, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[index]) for row in (header, *rows)) for index in range(len(header))]
    return [
        "  " + "  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
        for row in (header, *rows)
    ]
