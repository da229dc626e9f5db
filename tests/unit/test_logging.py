"""What every log record carries, in both formats: the context fields, Celery's task lines, redaction."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from shared.logging import begin_task, bind, configure_logging, end_task, log_context, remember_task
from shared.redaction import without_password

TURN = "turn_0af7651916cd43dd8448eb211c80319c"
SECRET = "provider-key-0123456789"


@contextmanager
def _configured(log_format: str) -> Iterator[None]:
    """Configure the root logger for one test, then put pytest's handlers back."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging("DEBUG", secrets=[SECRET], log_format=log_format)
        yield
        for handler in root.handlers:
            handler.flush()
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)


def _json_lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines()]


def test_json_lines_carry_every_field_null_when_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    with _configured("json"):
        logging.getLogger("aptix.test").info("no context here")
        with log_context(turn_id=TURN, session_id="sess_1", org_id="org-a", step="reasoner", iteration=2):
            logging.getLogger("aptix.test").warning("inside %s", "a step")
    bare, inside = _json_lines(capsys.readouterr().err)
    assert set(bare) == {"time", "level", "logger", "message", "turn_id", "session_id", "org_id", "step",
                         "iteration", "worker", "exception"}  # fmt: skip
    assert bare["turn_id"] is None and bare["worker"] is None and bare["exception"] is None
    assert bare["time"].endswith("Z") and bare["level"] == "INFO" and bare["logger"] == "aptix.test"
    assert inside["message"] == "inside a step"
    assert (inside["turn_id"], inside["session_id"], inside["org_id"], inside["step"], inside["iteration"]) == (
        TURN,
        "sess_1",
        "org-a",
        "reasoner",
        2,
    )


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_both_formats_redact_messages_and_tracebacks(log_format: str, capsys: pytest.CaptureFixture[str]) -> None:
    with _configured(log_format):
        logger = logging.getLogger("aptix.test")
        logger.warning("model said %s", f"Incorrect API key provided: {SECRET}")
        try:
            raise RuntimeError(f"key {SECRET} refused")
        except RuntimeError:
            logger.exception("calling the model")
    err = capsys.readouterr().err
    assert SECRET not in err and err.count("[REDACTED]") >= 2, err
    if log_format == "json":
        said, failed = _json_lines(err)
        assert said["message"] == "model said Incorrect API key provided: [REDACTED]"
        assert "RuntimeError: key [REDACTED] refused" in failed["exception"]


def test_celery_received_line_carries_the_turn_of_the_envelope_it_shows(capsys: pytest.CaptureFixture[str]) -> None:
    # Given Celery's "received" record, logged by the consumer before any task context exists
    argsrepr = repr([{"turn_id": TURN, "step": "llm_call", "round": 0, "hop": 6, "iteration": 1, "attempt": 0}])
    data = {"id": "task-1", "name": "aptix.step.llm_call", "args": argsrepr, "kwargs": "{}", "eta": None}
    with _configured("json"):
        logging.getLogger("celery.worker.strategy").info("Task %(name)s[%(id)s] received", data, extra={"data": data})
    (line,) = _json_lines(capsys.readouterr().err)
    assert (line["turn_id"], line["step"], line["iteration"]) == (TURN, "llm_call", 1)


def test_celery_lines_naming_only_a_task_id_find_the_turn_the_worker_was_handed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    remember_task("task-2", {"turn_id": TURN, "step": "persist", "iteration": 3})
    with _configured("json"):
        request_logger = logging.getLogger("celery.worker.request")
        request_logger.debug("Task accepted: %s[%s] pid:%r", "aptix.step.persist", "task-2", 7)
        request_logger.debug("Task accepted: %s[%s] pid:%r", "other", "task-3", 7)
    mine, other = _json_lines(capsys.readouterr().err)
    assert (mine["turn_id"], mine["step"]) == (TURN, "persist")
    assert other["turn_id"] is None


def test_fields_bound_by_the_driver_last_until_the_task_ends(capsys: pytest.CaptureFixture[str]) -> None:
    with _configured("json"):
        logger = logging.getLogger("aptix.test")
        begin_task(turn_id=TURN, step="entry", iteration=0)  # task_prerun
        with log_context(turn_id=TURN, step="request_handler"):  # the driver's own context
            bind(session_id="sess_1", org_id="org-a")  # once it has loaded the turn's state
        logger.info("succeeded")  # Celery's line, after the driver returned
        end_task()  # task_postrun
        logger.info("between tasks")
    succeeded, between = _json_lines(capsys.readouterr().err)
    assert (succeeded["turn_id"], succeeded["session_id"], succeeded["org_id"], succeeded["step"]) == (
        TURN,
        "sess_1",
        "org-a",
        "entry",
    )
    assert between["turn_id"] is None and between["session_id"] is None


def test_without_password_hides_only_the_password() -> None:
    assert (
        without_password("postgresql+psycopg://aptix:s3cret@db:5432/aptix")
        == "postgresql+psycopg://aptix:***@db:5432/aptix"
    )
    assert without_password("redis://:pw@redis:6379/0") == "redis://:***@redis:6379/0"
    assert without_password("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert without_password("sqlite:///./aptix-dev.sqlite") == "sqlite:///./aptix-dev.sqlite"
