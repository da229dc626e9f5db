"""The chaos suite's small matrix as a test: every fault once on its own system, a few hundred turns,
and a worker host cut off from Redis and PostgreSQL for 30 s (hosts apart: root only; without root the
test does not run and the run's summary says so).

``pytest -s`` shows each fault's table. The full matrix is ``make chaos`` (``python -m tests.chaos``); every
network fault is ``make chaos-net``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.chaos import FAULTS, RETRY_BUDGET_SECONDS, FaultReport, plans, render_summary, run_matrix
from tests.chaos.net.hosts import NOT_RUN, NetworkUnavailable, require_network
from tests.chaos.system import SystemOptions

pytestmark = pytest.mark.integration

WORKER_CONCURRENCY = SystemOptions().worker_concurrency


@pytest.mark.timeout(1800)
def test_small_fault_matrix_strands_loses_and_repeats_no_turn(services: None, tmp_path: Path) -> None:
    # Given the small matrix, each fault on a fresh system of its own
    fault_plans = plans(list(FAULTS), small=True)

    # When every fault runs while its turns run
    reports = run_matrix(fault_plans, log_dir=tmp_path / "chaos", settle_seconds=60.0, out=sys.stdout)
    summary = render_summary(reports, retry_budget_seconds=RETRY_BUDGET_SECONDS)
    sys.stdout.write(summary + "\n")

    # Then every accepted turn ended, once, and completed
    failures = [f"{report.name}: {failure}" for report in reports for failure in _failures(report)]
    assert [report.name for report in reports] == list(FAULTS)
    assert not failures, "\n".join(failures) + f"\n\n{summary}\n(logs in {tmp_path / 'chaos'})"


@pytest.mark.timeout(600)
def test_a_worker_host_cut_off_for_30_s_strands_loses_and_repeats_no_turn(services: None, tmp_path: Path) -> None:
    # Given hosts apart (the gateway and two workers each in a network namespace), where this machine allows
    try:
        require_network()
    except NetworkUnavailable as exc:
        pytest.skip(f"{NOT_RUN}: {exc}")

    # When worker1's host is cut off from Redis, PostgreSQL and the model for 30 s during a mixed load, then healed
    reports = run_matrix(plans(["worker_partition"], small=True), log_dir=tmp_path / "net", settle_seconds=60.0,
                         out=sys.stdout)  # fmt: skip

    # Then every accepted turn ended, once, and completed; no checkpoint was put back
    failures = [f"{report.name}: {failure}" for report in reports for failure in _failures(report)]
    summary = render_summary(reports, retry_budget_seconds=RETRY_BUDGET_SECONDS)
    assert not failures, "\n".join(failures) + f"\n\n{summary}\n(logs in {tmp_path / 'net'})"


def _failures(report: FaultReport) -> list[str]:
    checks = [
        (sum(report.unfinished.values()), "unfinished turns"),
        (report.lost, "lost turns"),
        (report.tool_runs["2+"], "turns ran their tool more than once"),
        (sum(report.failed.values()), f"failed turns {dict(report.failed)}"),
        (report.keys_with_extra_rows, "keys with more than one turn row"),
        (report.not_accepted, "turns never accepted"),
        (report.gateway_5xx_not_503(), "gateway answers 5xx other than 503"),
        (report.wrong_output, "completed turns with a wrong answer"),
        (len(report.run.broken_streams), f"resumed response streams broken {report.run.broken_streams}"),
        (report.unavailable_without_retry_after, "gateway 503 answers without Retry-After"),
        (len(report.snapshots_behind), f"ended turns whose checkpoint was put back {report.snapshots_behind}"),
        (len(report.run.broken_batch_files), f"broken OpenAI batch files {report.run.broken_batch_files}"),
    ]
    found = [f"{count} {what}" for count, what in checks if count] + report.poison_problems()
    if report.error:
        found.insert(0, "did not run to its end: " + report.error.strip().splitlines()[-1])
    # At most one repeated call per model call a kill interrupted: each killed worker runs
    # WORKER_CONCURRENCY steps at once, so that many calls may be in flight when it dies.
    slots = report.run.workers_killed * WORKER_CONCURRENCY
    if (
        report.name in ("worker_kill", "openai_worker_kill", "openai_batch_faults")
        and report.repeated_model_calls > slots
    ):
        found.append(
            f"{report.repeated_model_calls} repeated model calls for {report.run.workers_killed} killed workers "
            f"of {WORKER_CONCURRENCY} slots each"
        )
    return found
