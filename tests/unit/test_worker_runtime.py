"""WorkerRuntime and the workers' Celery app: nothing is built at import, the context only at worker start."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shared.settings import Settings
from shared.task_names import Layer
from tests.unit.fakes import FakeBroker
from workers import retry
from workers.runtime import WorkerRuntime

ROOT = Path(__file__).resolve().parents[2]


def _settings(tmp_path: Path) -> Settings:
    # Nothing connects until first use; the URLs only need to parse.
    return Settings(database_url=f"sqlite:///{tmp_path / 'worker.sqlite'}", redis_url="redis://127.0.0.1:1/0")


def test_importing_the_worker_modules_builds_no_app_and_sets_no_default_app() -> None:
    code = (
        "import celery, workers.app, workers.tasks, workers.runtime, workers.driver\n"
        "assert 'celery_app' not in vars(workers.app), 'celery_app was built at import'\n"
        "from shared.settings import Settings\n"
        "app = workers.app.create_celery(Settings())\n"
        "assert celery.current_app.main != app.main, 'the workers app made itself the default app'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True, text=True)


def test_runtime_context_raises_when_the_worker_did_not_start(tmp_path: Path) -> None:
    runtime = WorkerRuntime(_settings(tmp_path), FakeBroker())
    with pytest.raises(RuntimeError, match="not started"):
        runtime.context  # noqa: B018  # the property is the call under test
    with pytest.raises(RuntimeError, match="not started"):
        runtime.steps  # noqa: B018


def test_runtime_builds_its_context_at_start_and_a_new_one_in_a_prefork_child(tmp_path: Path) -> None:
    # Given a runtime started as worker node "steps@host"
    runtime = WorkerRuntime(_settings(tmp_path), FakeBroker())
    runtime.start("steps@host")
    parent = runtime.context
    assert parent.hostname == "steps@host"
    # and its step sender parks the waits the retry policy says to park
    assert runtime.steps.park_after == retry.park_after(runtime.context.settings)

    # When a prefork child starts
    runtime.restart_in_child()

    # Then the child has a context of its own, on the same node name
    assert runtime.context is not parent and runtime.context.hostname == "steps@host"
    assert runtime.context.states is not parent.states


def test_runtime_in_a_child_of_a_worker_that_never_started_builds_nothing(tmp_path: Path) -> None:
    runtime = WorkerRuntime(_settings(tmp_path), FakeBroker())
    runtime.restart_in_child()
    with pytest.raises(RuntimeError):
        runtime.context  # noqa: B018


class _NamedRuntime:
    """A runtime that only says which one it is when a task asks it for its context."""

    delays = None
    """No admission window: the task asks for it before the context."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def context(self) -> None:
        raise LookupError(self.name)


def test_a_second_worker_app_in_a_process_runs_its_steps_on_its_own_runtime() -> None:
    from celery import Celery

    from shared.models.envelope import TurnEnvelope
    from shared.task_names import StepName, task_name
    from workers.tasks import register_tasks

    # Given two worker apps in one process, each with its steps registered on a runtime of its own
    apps = [Celery(f"app-{index}", set_as_current=False) for index in range(2)]
    for app, name in zip(apps, ("first", "second"), strict=True):
        register_tasks(app, _NamedRuntime(name))  # type: ignore[arg-type]  # only its context is asked for
        app.finalize()
    payload = TurnEnvelope(turn_id="turn_" + "3" * 32, step=StepName.REQUEST_HANDLER).model_dump(mode="json")
    # When each app runs the first step, then each runs it on its own runtime
    for app, name in zip(apps, ("first", "second"), strict=True):
        with pytest.raises(LookupError, match=name):
            app.tasks[task_name(StepName.REQUEST_HANDLER)].run(payload)


def test_every_task_of_the_workers_app_keeps_one_result_backend_whatever_thread_runs_it(tmp_path: Path) -> None:
    # Celery keeps app.backend per thread, and a gevent pool's greenlets are threads to it
    from workers.app import create_celery

    app = create_celery(_settings(tmp_path), reconciler=False, scheduler=False)
    tasks = [task for name, task in app.tasks.items() if name.startswith("aptix.")]
    assert len(tasks) == len(Layer) + 1  # a task per layer, the webhook task
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.extend(task.backend for task in tasks))
    thread.start()
    thread.join()
    assert len({id(backend) for backend in seen}) == 1 and seen[0] is tasks[0].backend  # the main thread's
