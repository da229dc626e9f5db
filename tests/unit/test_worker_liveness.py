"""Worker liveness as plain functions: the verdict on a heartbeat, the folder ``aptix worker-health``
reads, and the heartbeat a process writes (tests/integration/test_worker_health.py runs real workers)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shared.settings import Settings
from workers.liveness import (
    Heartbeat,
    HeartbeatReport,
    RunningTask,
    assess,
    check_workers,
    heartbeat_path,
    limit_warnings,
    prepare_health_dir,
)

NOW = 1000.0


def _report(**changes: object) -> HeartbeatReport:
    fields: dict[str, object] = {
        "name": "pipeline", "hostname": "pipeline.w1@host", "pid": 42, "written_at": NOW - 1, "loop_at": NOW - 2,
        "connected": True, "stopping": False, "loop_runs_tasks": False, "oldest_task": None,
        "oldest_task_seconds": 0.0, "tools_overrunning": 0, "tool_threads": 16, "stale_seconds": 30.0,
        "task_stuck_seconds": 600.0,
    }  # fmt: skip
    fields.update(changes)
    return HeartbeatReport.model_validate(fields)


def test_assess_passes_a_process_that_writes_and_whose_loop_runs() -> None:
    verdict = assess(_report(), name="pipeline", now=NOW)
    assert verdict.ok and "alive" in verdict.message and "pid 42" in verdict.message


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"written_at": NOW - 31}, "no heartbeat for 31s"),
        ({"loop_at": NOW - 40}, "event loop has not run for 39s"),
        ({"oldest_task": "aptix.step.llm_call[t1]", "oldest_task_seconds": 601.0}, "llm_call[t1] has run 601s"),
        ({"tools_overrunning": 16}, "all 16 tool threads are held"),
    ],
    ids=["stale heartbeat", "stalled loop", "stuck task", "tool threads held"],
)
def test_assess_fails_a_hung_process_and_says_why(changes: dict[str, object], reason: str) -> None:
    verdict = assess(_report(**changes), name="pipeline", now=NOW)
    assert not verdict.ok and reason in verdict.message, verdict.message


def test_assess_passes_a_process_waiting_for_the_broker_or_shutting_down() -> None:
    # A stalled loop while disconnected is a broker outage, not a hang; warm shutdown is not one either
    reconnecting = assess(_report(connected=False, loop_at=NOW - 300), name="llm", now=NOW)
    assert reconnecting.ok and "not connected to the broker" in reconnecting.message
    assert assess(_report(stopping=True, loop_at=NOW - 300), name="llm", now=NOW).ok
    # but a stopped process that was shutting down is stopped
    assert not assess(_report(stopping=True, written_at=NOW - 60), name="llm", now=NOW).ok


def test_assess_lets_a_solo_pool_task_hold_the_loop_up_to_the_task_limit() -> None:
    solo = {"loop_runs_tasks": True, "loop_at": NOW - 100, "oldest_task": "aptix.step.llm_call[t]"}
    assert assess(_report(**solo, oldest_task_seconds=99.0), name="worker", now=NOW).ok
    assert not assess(_report(**solo, oldest_task_seconds=700.0), name="worker", now=NOW).ok
    assert not assess(_report(loop_runs_tasks=True, loop_at=NOW - 100), name="worker", now=NOW).ok


def test_assess_fails_a_process_that_never_wrote_a_heartbeat() -> None:
    verdict = assess(None, name="llm", now=NOW)
    assert not verdict.ok and "no heartbeat yet" in verdict.message


def test_check_workers_reads_every_process_the_manifest_names(tmp_path: Path) -> None:
    # Given a folder prepared for two processes, where an old run left a heartbeat behind
    heartbeat_path(tmp_path, "llm").write_text(_report(name="llm").model_dump_json())
    prepare_health_dir(tmp_path, ["pipeline", "llm"])
    heartbeat_path(tmp_path, "pipeline").write_text(_report().model_dump_json())
    # Then the old heartbeat does not stand for the new llm process
    verdicts = check_workers(tmp_path, now=NOW)
    assert [(v.name, v.ok) for v in verdicts] == [("pipeline", True), ("llm", False)]
    heartbeat_path(tmp_path, "llm").write_text("{not json")
    assert "unreadable heartbeat" in check_workers(tmp_path, now=NOW)[1].message


def test_check_workers_fails_when_no_worker_started_there(tmp_path: Path) -> None:
    (verdict,) = check_workers(tmp_path / "nothing", now=NOW)
    assert not verdict.ok and "no aptix worker has started" in verdict.message


def test_heartbeat_reports_the_oldest_task_the_tools_and_a_reconnect(tmp_path: Path) -> None:
    connected = [False]
    started = time.time() - 5
    heartbeat = Heartbeat(
        tmp_path / "w.heartbeat.json",
        name="w",
        hostname="w@host",
        settings=Settings(worker_heartbeat_stale_seconds=3),
        running=lambda: [RunningTask("aptix.step.reasoner", "b", started + 4), RunningTask("x", "a", started)],
        connected=lambda: connected[0],
        tools=lambda: (1, 4),
    )
    assert heartbeat.interval == 1.0
    heartbeat.write()
    written = json.loads((tmp_path / "w.heartbeat.json").read_text())
    assert written["oldest_task"] == "x[a]" and written["oldest_task_seconds"] >= 5
    assert (written["tools_overrunning"], written["tool_threads"], written["connected"]) == (1, 4, False)
    # When the connection comes back after a long outage, the loop is timed from the reconnect
    connected[0] = True
    report = heartbeat.report()
    assert report.connected and report.written_at - report.loop_at < 1
    heartbeat.stop()
    assert json.loads((tmp_path / "w.heartbeat.json").read_text())["stopping"] is True


def test_limit_warnings_name_a_task_limit_a_model_call_could_reach() -> None:
    assert limit_warnings(Settings()) == []
    (message,) = limit_warnings(Settings(worker_task_stuck_seconds=60, llm_timeout_seconds=120))
    assert "APTIX_WORKER_TASK_STUCK_SECONDS (60)" in message and "APTIX_LLM_TIMEOUT_SECONDS (120)" in message
