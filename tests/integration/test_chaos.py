"""The chaos suite's small matrix as a test: every fault once on its own system, a few hundred turns.

``pytest -s`` shows each fault's table. The full matrix is ``make chaos`` (``python -m tests.chaos``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.chaos import FAULTS, RETRY_BUDGET_SECONDS, FaultReport, plans, render_summary, run_matrix
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
        (len(report.run.broken_batch_files), f"broken OpenAI batch files {report.run.broken_batch_files}"),
    ]
    found = [f"{count} {what}" for count, what in checks if count]
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
