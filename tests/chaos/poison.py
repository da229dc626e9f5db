"""The poison-step fault: a few turns whose server tool kills the worker that runs it, among ordinary turns.

The tool (``poison``, ``tests.support.tools``) appends its key to the tool log, then SIGKILLs its own
process; it is catalogued ``idempotent: true``, so every delivery of its step runs it. A watcher
starts a new worker each time one dies, as a supervisor (Kubernetes, systemd) would. Aptix must give
each poison step up once it killed its worker ``APTIX_STEP_MAX_DELIVERIES`` times while running alone
there (its turn fails ``worker_lost``, the tool ran at most one time more: its first delivery, beside
other steps), the workers must stop dying once every poison turn has ended, and every ordinary turn
must complete as in any other fault (none given up beside a poison step).
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING

import httpx
import psycopg

from tests.chaos.load import SETTLED_STATUSES, Ledger, key_of, submit_batches
from tests.chaos.report import FaultRun
from tests.chaos.system import API_KEY, ChaosSystem

if TYPE_CHECKING:
    from tests.chaos.faults import FaultPlan

__all__ = ["POISON_TOOL", "poison_input", "poison_step"]

POISON_TOOL = {
    "name": "poison",
    "description": "Record that this turn ran its tool, then kill the worker running it.",
    "handler": "tests.support.tools:poison",
    "idempotent": True,
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
}
"""The chaos catalog's poison tool (``tests.chaos.runner.write_catalog`` offers it in mode general)."""
_QUIET_SECONDS = 15.0
"""How long the workers must live on once every poison turn ended (longer than the visibility timeout)."""
_POISON_TIMEOUT = 240.0


def poison_input(key: str) -> str:
    """The input of poison turn ``key`` (its key read back as :func:`tests.chaos.load.key_of` reads it)."""
    return f"[[call:poison {json.dumps({'key': key})}]] chaos {key}"


def poison_step(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """Post the poison turns among a batch of ordinary ones, replace each worker that dies, and check that
    the deaths stop once the poison turns ended."""
    # Each death of a worker also loses the deliveries of the ordinary steps it ran beside the poison one;
    # only deliveries lost while the step ran alone count (docs/faults.md, "Poison steps"), so none of
    # them may be given up, however many deaths they are beside.
    count = 3 if plan.small else 5
    run = FaultRun(
        f"{count} turns whose server tool SIGKILLs the worker running it (idempotent: run on every delivery) "
        f"among {plan.turns} ordinary turns; each dead worker replaced at once, as a supervisor does"
    )
    run.poison_keys = [f"pz-{index:05d}" for index in range(count)]
    ordinary = [f"ps-{index:05d}" for index in range(plan.turns)]
    supervisor = _Supervisor(system)
    started = time.monotonic()
    try:
        submit_batches(system.gateway_url, ordinary[: plan.turns // 2], ledger=ledger, batches=1)
        _post(system.gateway_url, run.poison_keys, ledger)
        submit_batches(system.gateway_url, ordinary[plan.turns // 2 :], ledger=ledger, batches=1)
        ended = _wait_ended(system.database.url, set(run.poison_keys), timeout=_POISON_TIMEOUT)
        run.notes.append(f"{ended} of {count} poison turns ended after {time.monotonic() - started:.0f} s, "
                         f"{supervisor.deaths} worker deaths")  # fmt: skip
        deaths = supervisor.deaths
        time.sleep(_QUIET_SECONDS)
        run.deaths_after_given_up = supervisor.deaths - deaths
    finally:
        supervisor.stop()
    run.worker_deaths = supervisor.deaths
    after = f"{run.deaths_after_given_up} in the {_QUIET_SECONDS:.0f} s after the poison turns ended"
    run.notes.append(f"{run.worker_deaths} worker processes died and were replaced; {after}")
    for worker in list(system.workers):
        system.wait_worker(worker)
    run.fault_seconds = time.monotonic() - started
    return run


def _post(gateway_url: str, keys: list[str], ledger: Ledger) -> None:
    """POST each poison turn once (a 503 is retried for up to a minute)."""
    with httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30.0) as client:
        for key in keys:
            deadline = time.monotonic() + 60.0
            while True:
                try:
                    status: int | None = client.post("/v1/turns", json={"input": poison_input(key)}).status_code
                except httpx.TransportError:
                    status = None
                final = (status is not None and status < 500) or time.monotonic() >= deadline
                ledger.answer(status, [key], final=final)
                if final:
                    break
                time.sleep(0.5)


def _wait_ended(database_url: str, keys: set[str], *, timeout: float) -> int:
    """Wait until every turn of ``keys`` settled (or ``timeout``); how many did."""
    deadline = time.monotonic() + timeout
    settled = 0
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(database_url, connect_timeout=5) as conn:
                rows = conn.execute("SELECT request, status FROM turns").fetchall()
        except psycopg.OperationalError:
            rows = None
        if rows is not None:
            settled = sum(1 for request, status in rows if _key(request) in keys and status in SETTLED_STATUSES)
            if settled >= len(keys):
                break
        time.sleep(0.5)
    return settled


def _key(request: object) -> str | None:
    text = request.get("input") if isinstance(request, dict) else None
    return key_of(text) if isinstance(text, str) else None


class _Supervisor:
    """Replaces each worker of the system that died (the poison killed it), until stopped; counts the deaths."""

    def __init__(self, system: ChaosSystem) -> None:
        self._system = system
        self._stop = threading.Event()
        self.deaths = 0
        self._thread = threading.Thread(target=self._run, name="chaos-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for worker in list(self._system.workers):
                if not worker.alive():
                    self._system.workers.remove(worker)
                    self.deaths += 1
                    self._system.spawn_worker()
