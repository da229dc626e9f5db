"""The admission window with real processes: a worker notes how long each step message waited for its task and
reports it where the admission scheduler reads it, and a batch released through the window runs to its end
(``workers.dispatch_delays``, ``workers.admission_window``; on when ``APTIX_ADMISSION_TARGET_DELAY_MS`` is set)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripted_llm import ScriptedServer
from shared.state.admission import AdmissionQueue
from tests.conftest import KEY_A
from tests.integration.conftest import System, own_system
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TURNS = 60


@pytest.fixture(scope="module")
def window_system(database_url: str, scripted_llm: ScriptedServer, modes_file: Path) -> Iterator[System]:
    """A gateway and one worker (its scheduler included) with the admission window on, on their own Redis."""
    env = {"APTIX_ADMISSION_TARGET_DELAY_MS": "5"}
    with own_system(database_url=database_url, llm=scripted_llm, modes_file=modes_file, env=env) as (stack, system):
        stack.start_worker("window1")
        yield system


def test_the_workers_report_how_long_their_step_messages_waited(window_system: System) -> None:
    # Given turns run through the real gateway and worker, more than half a second apart (a report is due every 0.5 s)
    started = time.time()
    for index in range(3):
        assert window_system.run_turn({"input": f"dispatch delay {index}"})["status"] == "completed"
        time.sleep(0.6)
    window_system.run_turn({"input": "dispatch delay last"})
    # Then the worker's processes have reported since, each its shortest wait and how many task starts it covers
    reports = AdmissionQueue(window_system.redis).delays(now=time.time())
    assert reports, "no worker process reported its dispatch delays"
    assert all(report.at >= started and report.samples >= 1 for report in reports)
    # And the waits are those of messages sent moments before: the header came through, on this host's clock
    assert all(0.0 <= report.least < 1.0 for report in reports)


def test_a_batch_released_through_the_window_runs_every_turn_once(window_system: System) -> None:
    # Given a batch of 60 turns, held and released through the window (it starts at 8 turns in flight)
    marker = uuid.uuid4().hex[:8]
    response = window_system.http.post(
        "/v1/batches",
        json={"requests": [{"input": f"window {index} {marker}"} for index in range(TURNS)]},
        headers=window_system.headers(KEY_A),
    )
    assert response.status_code == 202, response.text
    batch_id = response.json()["batch_id"]

    def completed() -> int | None:
        counts = window_system.http.get(f"/v1/batches/{batch_id}", headers=window_system.headers(KEY_A)).json()
        return counts["counts"]["completed"] if counts["counts"]["completed"] == TURNS else None

    # Then every turn completes, and the model was asked once per turn
    wait_for(completed, seconds=120, interval=0.5, what="the batch's 60 turns")
    assert len(window_system.llm_requests(marker)) == TURNS
