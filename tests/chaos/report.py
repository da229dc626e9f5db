"""FaultReport: one fault's outcome counted from the evidence, its verdict, and the plain-text tables.

A fault fails when a turn is unfinished or lost, a tool ran twice for one turn, a key has two turn
rows, a turn was never accepted, the gateway answered a 5xx other than 503, a completed turn has
the wrong answer, a response stream read in pieces broke a promise (a gap, a repeat, no terminal
event, deltas that do not join to the text), the fault could not run to its end, or (when the fault
was shorter than the model retry budget) any turn failed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise

from tests.chaos.evidence import Evidence
from tests.chaos.load import SETTLED_STATUSES, Ledger

__all__ = ["FaultReport", "FaultRun", "build_report", "render_fault", "render_summary"]

MAX_DELIVERIES = 3
"""``APTIX_STEP_MAX_DELIVERIES`` of the chaos system (the default): the lost deliveries of a poison step, the last
while it ran alone, after which it is given up."""
MAX_POISON_RUNS = MAX_DELIVERIES
"""The most runs of a poison turn's tool."""
_POISON_END = "failed worker_lost"
EXPECTED_MODEL_CALLS = 2
"""Model calls of one turn: the call that asks for ``count_run``, then the answer."""
_EXAMPLES = 5


@dataclass(slots=True)
class FaultRun:
    """What a fault function did (never how the turns ended: that comes from the evidence)."""

    description: str
    fault_seconds: float = 0.0
    """How long the fault lasted, from its first action to the system being whole again."""
    workers_killed: int = 0
    stream_keys: list[str] = field(default_factory=list)
    """The keys whose response streams were read in pieces (dropped and resumed with ``starting_after``) and checked."""
    broken_streams: list[str] = field(default_factory=list)
    """Each checked stream that broke a promise, with what broke."""
    poison_keys: list[str] = field(default_factory=list)
    """The keys of turns whose server tool kills its worker (``tests.chaos.poison``): each must fail
    ``worker_lost`` with its tool run at most ``MAX_POISON_RUNS`` times; they are counted apart."""
    worker_deaths: int = 0
    """Worker processes that died by themselves (a poison step killed them) and were replaced."""
    deaths_after_given_up: int = 0
    """Of those, the ones that died once every poison turn had ended (the workers must stop dying)."""
    client_tool_keys: set[str] = field(default_factory=set)
    """The keys run as client-tool turns (``tests.chaos.load.client_tool_turns``): the harness answered their
    tool calls, so one left paused is unfinished, and they run no server tool."""
    max_answer_seconds: float | None = None
    """The longest a gateway answer may take under this fault (None: no limit): a dependency cut off must be a
    prompt 503, not a request held until the client gives up."""
    struck_at: float | None = None
    """When a single blow struck (Unix time; the Sentinel fault's SIGKILL of the primary): the report
    measures the stall from it."""
    batch_files: int = 0
    """The OpenAI batches whose output and error files were read and checked."""
    broken_batch_files: list[str] = field(default_factory=list)
    """What broke the promise of those files (a request in neither file, in both, twice, ...)."""
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class FaultReport:
    """The counted outcome of one fault."""

    name: str
    run: FaultRun
    seconds: float = 0.0
    """Wall time of the whole fault: start-up, load, fault, settling and evidence."""
    accepted: int = 0
    not_accepted: int = 0
    rows: int = 0
    completed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    unfinished: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    unacknowledged: int = 0
    """Turn rows whose submission the gateway never acknowledged with a 2xx."""
    keys_with_extra_rows: int = 0
    tool_runs: Counter[str] = field(default_factory=Counter)
    """Turns by how often their tool ran: "0", "1", "2+"."""
    stray_tool_runs: int = 0
    """Tool runs for keys without a turn row."""
    repeated_model_calls: int = 0
    max_repeated_model_calls: int = 0
    wrong_output: int = 0
    streams_interrupted: int = 0
    """Checked streams whose turn a kill interrupted (re-driven by the reconciler, or a model call made again)."""
    outcome_unknown: int = 0
    """Completed turns whose model was told the tool's outcome is unknown (its worker died while it ran):
    the designed answer when a tool that is not idempotent may or may not have taken effect."""
    poisoned: Counter[str] = field(default_factory=Counter)
    """The poison turns by how they ended (``failed worker_lost``, ``completed``, ``running``, ...)."""
    poison_runs: int = 0
    """The most runs of one poison turn's tool."""
    http_errors: Counter[str] = field(default_factory=Counter)
    unavailable_without_retry_after: int = 0
    """Gateway 503 answers without a ``Retry-After`` header."""
    slowest_answer_seconds: float = 0.0
    """The longest a timed gateway request took to be answered (or to fail)."""
    slowest_error_seconds: float = 0.0
    """The longest a gateway error answer (or a failed connection) took to come."""
    snapshots_behind: list[str] = field(default_factory=list)
    """Ended turns whose database checkpoint was put back behind their commit point (``Evidence.snapshots_behind``)."""
    longest_stall: float = 0.0
    """The longest any turn's event log stood still (``Evidence.stalls``), in seconds."""
    longest_stall_key: str | None = None
    stall_seconds: float | None = None
    """From the blow (``FaultRun.struck_at``) to the next completed turn; None: no blow, or nothing completed after."""
    longest_pause_seconds: float | None = None
    """The longest time from the blow on without a turn completing (the stall, or a later gap if longer)."""
    error: str | None = None
    """Why the fault did not run to its end (start-up or harness trouble)."""
    examples: list[str] = field(default_factory=list)
    """A few unfinished, failed or duplicated turns (key, turn id, status), to look up in the logs."""

    def gateway_5xx_not_503(self) -> int:
        """Gateway answers with a 5xx status other than 503."""
        return sum(n for status, n in self.http_errors.items() if status.startswith("5") and status != "503")

    def problems(self, *, retry_budget_seconds: float) -> list[str]:
        """Why this fault fails ([] when it passes)."""
        found = [f"did not run to its end: {_last_line(self.error)}"] if self.error else []
        checks = [
            (sum(self.unfinished.values()), "unfinished turns"),
            (self.lost, "lost turns"),
            (self.tool_runs["2+"], "turns ran their tool twice or more"),
            (self.keys_with_extra_rows, "keys with more than one turn row"),
            (self.not_accepted, "turns never accepted"),
            (self.gateway_5xx_not_503(), "gateway answers 5xx other than 503"),
            (self.wrong_output, "completed turns with a wrong answer"),
            (len(self.run.broken_streams), "resumed response streams broken"),
            (self.unavailable_without_retry_after, "gateway 503 answers without Retry-After"),
            (len(self.snapshots_behind), "ended turns whose checkpoint was put back behind their commit"),
            (len(self.run.broken_batch_files), "broken promises of OpenAI batch files"),
        ]
        limit = self.run.max_answer_seconds
        if limit is not None and self.slowest_answer_seconds > limit:
            found.append(f"a gateway answer took {self.slowest_answer_seconds:.1f} s (at most {limit:.0f} s allowed)")
        if self.run.fault_seconds < retry_budget_seconds:
            checks.append((sum(self.failed.values()), "failed turns (fault shorter than the retry budget)"))
        return found + [f"{count} {what}" for count, what in checks if count] + self.poison_problems()

    def poison_problems(self) -> list[str]:
        """Why the poison turns broke a promise ([] when they kept them, or when there were none)."""
        if not self.run.poison_keys:
            return []
        found = []
        wrong = len(self.run.poison_keys) - self.poisoned[_POISON_END]
        if wrong:
            found.append(f"{wrong} poison turns did not fail worker_lost {dict(self.poisoned)}")
        if self.poison_runs > MAX_POISON_RUNS:
            found.append(f"a poison turn's tool ran {self.poison_runs} times (more than {MAX_POISON_RUNS})")
        if self.run.deaths_after_given_up:
            found.append(f"{self.run.deaths_after_given_up} workers died after every poison turn had ended")
        return found


def build_report(name: str, run: FaultRun, ledger: Ledger, evidence: Evidence) -> FaultReport:
    """Count the outcome of one fault from the ground truth and the gateway's answers."""
    report = FaultReport(
        name=name,
        run=run,
        http_errors=Counter(ledger.errors),
        unavailable_without_retry_after=ledger.unavailable_without_retry_after,
        slowest_error_seconds=ledger.slowest_error_seconds,
        slowest_answer_seconds=ledger.slowest_answer_seconds,
    )
    rows_per_key = Counter(turn.key for turn in evidence.turns if turn.key is not None)
    poison = set(run.poison_keys)
    keys = (set(rows_per_key) | ledger.accepted) - poison
    report.accepted = len(ledger.accepted)
    report.not_accepted = len(ledger.rejected - ledger.accepted)
    report.rows = len(evidence.turns)
    report.lost = len(ledger.accepted - set(rows_per_key))
    report.unacknowledged = len(set(rows_per_key) - ledger.accepted)
    report.keys_with_extra_rows = sum(1 for count in rows_per_key.values() if count > 1)
    # Unfinished turns first, so the examples show them before failed ones.
    for turn in sorted(evidence.turns, key=lambda turn: (turn.status in SETTLED_STATUSES, turn.key or "")):
        if turn.key in poison:
            report.poisoned[f"{turn.status} {turn.error_code}" if turn.error_code else turn.status] += 1
            continue
        client_tool = turn.key in run.client_tool_keys
        if turn.status == "completed":
            report.completed += 1
            if turn.output_text is not None and "outcome of this count_run call is unknown" in turn.output_text:
                report.outcome_unknown += 1
            elif turn.key is None or turn.output_text != _expected_output(turn.key, client_tool=client_tool):
                report.wrong_output += 1
        elif turn.status == "failed":
            report.failed[turn.error_code or "unknown"] += 1
        elif turn.status not in SETTLED_STATUSES or client_tool:
            report.unfinished[turn.status] += 1
        else:
            continue
        if turn.status != "completed" and len(report.examples) < _EXAMPLES:
            why = f" {turn.error_code}" if turn.error_code else ""
            report.examples.append(f"{turn.key} {turn.turn_id} {turn.status}{why}")
            if turn.turn_id in evidence.post_mortem:
                report.examples.append(f"  {evidence.post_mortem[turn.turn_id]}")
    server_keys = keys - run.client_tool_keys
    report.tool_runs = Counter(_bucket(evidence.tool_runs[key]) for key in server_keys)
    duplicated = sorted(key for key in server_keys if evidence.tool_runs[key] > 1)
    report.examples += [f"{key} ran its tool {evidence.tool_runs[key]} times" for key in duplicated[:_EXAMPLES]]
    report.examples += [f"stream {broken}" for broken in run.broken_streams[:_EXAMPLES]]
    report.examples += [f"batch files: {broken}" for broken in run.broken_batch_files[:_EXAMPLES]]
    redriven = {turn.key for turn in evidence.turns if turn.redrives}
    report.streams_interrupted = sum(
        1 for key in run.stream_keys if key in redriven or evidence.model_calls[key] > EXPECTED_MODEL_CALLS
    )
    report.poison_runs = max((evidence.tool_runs[key] for key in poison), default=0)
    report.stray_tool_runs = sum(count for key, count in evidence.tool_runs.items() if key not in server_keys | poison)
    # A poison turn ends early (TurnEnding: the row failed worker_lost, its last checkpoint left as the
    # step wrote it), not through a commit: its checkpoint was never put back, so it is counted apart too.
    report.snapshots_behind = [key for key in evidence.snapshots_behind if key not in poison]
    report.examples += [f"{key}: checkpoint behind its commit" for key in report.snapshots_behind[:_EXAMPLES]]
    if evidence.stalls:
        report.longest_stall_key, report.longest_stall = max(evidence.stalls.items(), key=lambda item: item[1])
    repeats = [max(0, evidence.model_calls[key] - EXPECTED_MODEL_CALLS) for key in keys]
    report.repeated_model_calls = sum(repeats)
    report.max_repeated_model_calls = max(repeats, default=0)
    if run.struck_at is not None:
        report.stall_seconds, report.longest_pause_seconds = _stall(run.struck_at, evidence)
    return report


def _expected_output(key: str, *, client_tool: bool) -> str:
    """The answer a completed chaos turn must have: the scripted model's summary of its tool's result."""
    return f"Tool results: {'client_echo' if client_tool else 'count_run'}=ran {key}"


def _stall(struck_at: float, evidence: Evidence) -> tuple[float | None, float | None]:
    """Seconds from ``struck_at`` to the first turn completed after it, and the longest gap between completions
    from ``struck_at`` on (both None when no turn completed after it)."""
    after = sorted(t.completed_at for t in evidence.turns if t.completed_at is not None and t.completed_at > struck_at)
    if not after:
        return None, None
    moments = [struck_at, *after]
    return after[0] - struck_at, max(later - earlier for earlier, later in pairwise(moments))


def render_fault(report: FaultReport, *, retry_budget_seconds: float) -> str:
    """One fault's table, as plain text."""
    problems = report.problems(retry_budget_seconds=retry_budget_seconds)
    verdict = "PASS" if not problems else "FAIL"
    lines = [
        f"== {report.name}: {verdict} ({report.seconds:.0f} s; fault lasted {report.run.fault_seconds:.1f} s)",
        f"   {report.run.description}",
        *(f"   {note}" for note in report.run.notes),
    ]
    rows = [
        ("turns accepted", f"{report.accepted}"
         + (f"  (not accepted: {report.not_accepted})" if report.not_accepted else "")),
        ("turn rows", f"{report.rows}  (never acknowledged: {report.unacknowledged})"),
        ("completed", f"{report.completed}"
         + (f"  (wrong answer: {report.wrong_output})" if report.wrong_output else "")
         + (f"  (tool outcome unknown: {report.outcome_unknown})" if report.outcome_unknown else "")),
        ("failed", _with_breakdown(report.failed)),
        ("unfinished", _with_breakdown(report.unfinished)),
        ("lost", str(report.lost)),
        ("tool runs per turn", "  ".join(f"{b}: {report.tool_runs[b]}" for b in ("0", "1", "2+"))
         + (f"  (stray runs: {report.stray_tool_runs})" if report.stray_tool_runs else "")),
        ("repeated model calls",
         f"{report.repeated_model_calls} total, max {report.max_repeated_model_calls} per turn"),
        ("checkpoints put back", str(len(report.snapshots_behind))),
        ("longest stall", f"{report.longest_stall:.1f} s"
         + (f"  ({report.longest_stall_key})" if report.longest_stall_key else "")),
        ("workers killed", str(report.run.workers_killed)),
        ("gateway 5xx other than 503", str(report.gateway_5xx_not_503())),
        ("gateway non-2xx answers", _with_breakdown(report.http_errors)
         + (f"  (slowest {report.slowest_error_seconds:.2f} s)" if report.slowest_error_seconds else "")
         + (f"  (503 without Retry-After: {report.unavailable_without_retry_after})"
            if report.unavailable_without_retry_after else "")),
    ]  # fmt: skip
    if report.run.poison_keys:
        deaths = f"worker deaths: {report.run.worker_deaths}, after they ended: {report.run.deaths_after_given_up}"
        runs = f"tool runs, at most: {report.poison_runs}"
        rows.append(("poison turns", f"{_with_breakdown(report.poisoned)}  ({runs}; {deaths})"))
    if report.run.client_tool_keys:
        rows.insert(1, ("client-tool turns", str(len(report.run.client_tool_keys))))
    if report.run.struck_at is not None:
        rows.append(("stall after the kill", _seconds(report.stall_seconds) + " to the next completed turn"
                     f"  (longest pause from the kill on: {_seconds(report.longest_pause_seconds)})"))  # fmt: skip
    if report.run.stream_keys:
        rows.append(("streams checked / broken", f"{len(report.run.stream_keys)} / {len(report.run.broken_streams)}"
                     f"  (on a turn a kill interrupted: {report.streams_interrupted})"))  # fmt: skip
    if report.run.batch_files:
        rows.append(("batch files / problems",
                     f"{report.run.batch_files} batches / {len(report.run.broken_batch_files)} problems"))  # fmt: skip
    lines += [f"   {label:<27} {value}" for label, value in rows]
    if report.examples and problems:
        lines += ["   for example:", *(f"     {example}" for example in report.examples)]
    if report.error:
        lines += ["   error:", *(f"     {line}" for line in report.error.splitlines()[-12:])]
    lines += [f"   FAIL: {problem}" for problem in problems]
    return "\n".join(lines)


def render_summary(reports: list[FaultReport], *, retry_budget_seconds: float) -> str:
    """One line per fault: the headline figures and the verdict."""
    header = (
        "fault", "accepted", "done", "failed", "unfin.", "lost", "tool 0/1/2+", "model rep.", "stall", "5xx", "verdict"
    )  # fmt: skip
    table = [header]
    for r in reports:
        verdict = "PASS" if not r.problems(retry_budget_seconds=retry_budget_seconds) else "FAIL"
        table.append((
            r.name, str(r.accepted), str(r.completed), str(sum(r.failed.values())), str(sum(r.unfinished.values())),
            str(r.lost), f"{r.tool_runs['0']}/{r.tool_runs['1']}/{r.tool_runs['2+']}",
            f"{r.repeated_model_calls} (max {r.max_repeated_model_calls})", f"{r.longest_stall:.1f} s",
            str(r.gateway_5xx_not_503()),
            verdict if r.error is None else "FAIL (did not run)",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in table)
    return "\n".join(line.rstrip() for line in lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"


def _bucket(runs: int) -> str:
    return "2+" if runs >= 2 else str(runs)


def _with_breakdown(counts: Counter[str]) -> str:
    total = sum(counts.values())
    detail = ", ".join(f"{key} {n}" for key, n in counts.most_common())
    return f"{total}  ({detail})" if detail else str(total)
