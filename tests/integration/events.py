"""TaskEventRecorder: listens to the workers' Celery task events (the stream Flower shows).

Workers start with task events off; like Flower, the recorder turns them on (the ``enable_events``
broadcast) when it starts and again every second, for workers that start later.
"""

from __future__ import annotations

import ast
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery

from tests.support.waiting import wait_for


class TaskEventRecorder:
    """Collects task events (received, started, succeeded, failed, ...) in a background thread."""

    def __init__(self, broker_url: str) -> None:
        self._app = Celery("aptix-test-events", broker=broker_url, set_as_current=False)
        self._app.conf.accept_content = ["json"]
        self._app.conf.event_serializer = "json"
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="task-events")

    def start(self) -> None:
        """Start listening; returns once the event queue is bound and every worker sends events."""
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("could not subscribe to Celery task events")

        def every_worker_sends_events() -> bool:
            workers = self._app.control.ping(timeout=1.0)
            enabled = self._app.control.broadcast("enable_events", reply=True, timeout=1.0)
            return bool(workers) and len(enabled) >= len(workers)

        wait_for(every_worker_sends_events, what="every worker to turn its task events on", seconds=15, interval=0)
        threading.Thread(target=self._keep_enabling, daemon=True, name="task-events-enable").start()

    def stop(self) -> None:
        """Stop listening."""
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=10)

    def events(self) -> list[dict[str, Any]]:
        """Every event so far."""
        with self._lock:
            return list(self._events)

    def succeeded_tasks(self, turn_id: str) -> list[str]:
        """Names of the tasks that succeeded for ``turn_id`` so far, in the order they were received (see
        :meth:`succeeded_results`)."""
        return [str(task.get("name")) for task, _ in self._succeeded(turn_id)]

    def succeeded_hops(self, turn_id: str) -> list[str]:
        """Names of the tasks that succeeded for ``turn_id``, one per hop of the chain, in order.

        A step sent again later (a retry: the same round and hop, the next attempt) counts once, so
        what is left is the chain's hops whatever the retries.
        """
        events = self.events()
        received = {e["uuid"]: e for e in events if e["type"] == "task-received"}
        hops: dict[tuple[int, int], str] = {}
        for event in events:
            task = received.get(event["uuid"]) if event["type"] == "task-succeeded" else None
            if task is None or turn_id not in str(task.get("args", "")):
                continue
            (envelope,) = ast.literal_eval(str(task["args"]))
            hops.setdefault((int(envelope.get("round", 0)), int(envelope.get("hop", 0))), str(task.get("name")))
        return [hops[key] for key in sorted(hops)]

    def succeeded_results(self, turn_id: str) -> list[str]:
        """The results (Flower's Result column) of the tasks that succeeded for ``turn_id`` so far, in the order the
        tasks were received. Not the order their successes arrived: a task sends its next step's message before it
        returns, so a short next task in another process or thread can report its success first."""
        return [str(success.get("result")) for _, success in self._succeeded(turn_id)]

    def _succeeded(self, turn_id: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The task-received and task-succeeded events of each task of ``turn_id`` that succeeded, in the order the
        tasks were received (one snapshot: the listener keeps appending meanwhile)."""
        events = self.events()
        succeeded = {e["uuid"]: e for e in events if e["type"] == "task-succeeded"}
        tasks: dict[str, dict[str, Any]] = {}  # a task received twice (delivered again) keeps its first place
        for e in events:
            if e["type"] == "task-received" and e["uuid"] in succeeded and turn_id in str(e.get("args", "")):
                tasks.setdefault(e["uuid"], e)
        return [(task, succeeded[task_id]) for task_id, task in tasks.items()]

    def task_events(self, turn_id: str) -> dict[str, list[dict[str, Any]]]:
        """Every event of each task of ``turn_id`` so far, by task id, in the order they arrived."""
        events = self.events()
        ours = {e["uuid"] for e in events if e["type"] == "task-received" and turn_id in str(e.get("args", ""))}
        tasks: dict[str, list[dict[str, Any]]] = {task_id: [] for task_id in ours}
        for event in events:
            if event.get("uuid") in tasks:
                tasks[event["uuid"]].append(event)
        return tasks

    def _keep_enabling(self) -> None:
        while not (self._receiver is not None and self._receiver.should_stop):
            time.sleep(1.0)
            try:
                self._app.control.enable_events()
            except Exception:  # the broker may be restarting under a fault test; try again next second
                continue

    def _run(self) -> None:
        with self._app.connection() as connection:
            self._receiver = self._app.events.Receiver(connection, handlers={"*": self._on_event})
            with self._receiver.consumer_context(wakeup=False) as (conn, _channel, _consumers):
                self._ready.set()
                while not self._receiver.should_stop:
                    try:
                        conn.drain_events(timeout=0.5)
                    except TimeoutError:
                        continue

    def _on_event(self, event: dict[str, Any]) -> None:
        if str(event.get("type", "")).startswith("task-"):
            with self._lock:
                self._events.append(event)


@contextmanager
def recording(broker_url: str) -> Iterator[TaskEventRecorder]:
    """A started :class:`TaskEventRecorder` on the broker of ``broker_url``, stopped at the end of the block."""
    recorder = TaskEventRecorder(broker_url)
    recorder.start()
    try:
        yield recorder
    finally:
        recorder.stop()
