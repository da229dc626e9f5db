"""Logging: :func:`configure_logging` for every entrypoint, and the context stamped on every record.

Every record carries the fields of :data:`CONTEXT_FIELDS` (``turn_id``, ``session_id``, ``org_id``,
``step``, ``iteration``, ``worker``) where they are known, each found the cheap way:

- the log context, a contextvar. A worker opens a task's context from its envelope before the task
  runs (:func:`begin_task`, from Celery's ``task_prerun``), so everything logged while the step runs,
  Celery's "succeeded" line included, carries the turn, step and iteration; the driver adds the
  session and org once it has loaded the turn's state (:func:`bind`). :func:`log_context` opens a
  nested context anywhere else (the gateway's access line).
- the process: a worker's Celery node name (:func:`set_process_fields`).
- Celery's lines about a task it has not started yet. "received" comes with the task's
  ``argsrepr`` (the envelope, ``shared.step_sender``), read with one short regex; later lines
  that name only the task id ("accepted", a lost child's "raised error") find the fields a worker
  remembered when it was handed the task (:func:`remember_task`). Records of other loggers, and
  records inside a task, never pay for either.

``APTIX_LOG_FORMAT`` chooses ``text`` (one readable line per record) or ``json`` (one object per
line, every field present, ``null`` when unknown). Both go through
:class:`shared.redaction.RedactingFilter`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import logging.config
import re
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

__all__ = [
    "CONTEXT_FIELDS",
    "JsonFormatter",
    "begin_task",
    "bind",
    "configure_logging",
    "end_task",
    "log_context",
    "logging_configured",
    "remember_task",
    "set_process_fields",
]

CONTEXT_FIELDS = ("turn_id", "session_id", "org_id", "step", "iteration", "worker")
"""The fields every record carries (``-`` in text, ``null`` in JSON when unknown)."""

_EMPTY: Mapping[str, object] = MappingProxyType({})
_CONTEXT: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar("aptix_log_context", default=_EMPTY)
_TASK: contextvars.ContextVar[dict[str, object] | None] = contextvars.ContextVar("aptix_log_task", default=None)
_PROCESS: dict[str, object] = {}
_TASKS: OrderedDict[str, Mapping[str, object]] = OrderedDict()
_MAX_TASKS = 4096
"""Task ids remembered: well above the tasks one worker process holds at once (a gevent pool of 2,000)."""
# The envelope as Celery's "received" and "succeeded" lines show it: repr([envelope]).
_ENVELOPE = re.compile(r"'turn_id': '([^']*)', 'step': '([^']*)'.*?'iteration': (\d+)")
_configured = False


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Stamp ``fields`` (any of :data:`CONTEXT_FIELDS`) on the records logged inside."""
    token = _CONTEXT.set({**_CONTEXT.get(), **fields})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def begin_task(**fields: object) -> None:
    """Open the log context of the task this thread (or greenlet) starts; it lasts until :func:`end_task`."""
    task = dict(fields)
    _TASK.set(task)
    _CONTEXT.set(task)


def end_task() -> None:
    """Close the context :func:`begin_task` opened."""
    _TASK.set(None)
    _CONTEXT.set(_EMPTY)


def bind(**fields: object) -> None:
    """Add ``fields`` to the current log context and to the running task's, so they last until it ends.

    The driver calls it once it knows the turn's session and org: Celery's "succeeded" line,
    logged after the driver returned, carries them too.
    """
    _CONTEXT.set({**_CONTEXT.get(), **fields})
    task = _TASK.get()
    if task is not None:
        task.update(fields)


def set_process_fields(**fields: object) -> None:
    """Stamp ``fields`` on every record of this process that no context overrides (a worker's node name)."""
    _PROCESS.update(fields)


def remember_task(task_id: str, fields: Mapping[str, object]) -> None:
    """Remember the context of a task a worker was handed, for Celery's lines that name only its id."""
    _TASKS[task_id] = fields
    if len(_TASKS) > _MAX_TASKS:
        with contextlib.suppress(KeyError):  # another thread emptied it meanwhile
            _TASKS.popitem(last=False)


def logging_configured() -> bool:
    """Whether :func:`configure_logging` ran in this process."""
    return _configured


def configure_logging(level: str | int = "INFO", *, secrets: Iterable[str] = (), log_format: str = "text") -> None:
    """Configure the root logger, at an entrypoint.

    Args:
        level: the root level.
        secrets: values no log line may show (:func:`shared.redaction.secrets_in`); redacted from
            every record's message and traceback.
        log_format: ``text`` or ``json`` (``APTIX_LOG_FORMAT``).

    Raises:
        ValueError: an unknown ``log_format``.
    """
    global _configured
    from shared.redaction import RedactingFilter  # imports settings: only when logging is set up

    if log_format not in ("text", "json"):
        raise ValueError(f"log format {log_format!r}: expected text or json")
    formatters: dict[str, dict[str, Any]] = {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [turn=%(turn_id)s step=%(step)s] %(message)s"},
        "json": {"()": JsonFormatter},
    }
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "filters": {
                "context": {"()": _ContextFilter, "missing": "-" if log_format == "text" else None},
                "redact": {"()": RedactingFilter, "secrets": tuple(secrets)},
            },
            "formatters": {log_format: formatters[log_format]},
            "handlers": {
                "stderr": {"class": "logging.StreamHandler", "formatter": log_format, "filters": ["context", "redact"]}
            },
            "root": {"level": level, "handlers": ["stderr"]},
        }
    )
    logging.captureWarnings(True)  # a library's warning is a record too (one JSON line, not several of text)
    _configured = True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the context fields, exception.

    Every key is always present (``null`` when unknown). A record may add keys of its own with
    ``extra={"fields": {...}}`` (the gateway's access and start lines); they never replace these.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        seconds = int(record.created)
        entry: dict[str, object] = {
            "time": f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            entry[field] = getattr(record, field, None)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        entry["exception"] = record.exc_text or None
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        extra = getattr(record, "fields", None)
        if isinstance(extra, Mapping):
            for key, value in extra.items():
                entry.setdefault(str(key), value)
        return json.dumps(entry, default=str)


class _ContextFilter(logging.Filter):
    """Stamps :data:`CONTEXT_FIELDS` on each record, ``missing`` where unknown."""

    def __init__(self, missing: object = "-") -> None:
        super().__init__()
        self._missing = missing

    def filter(self, record: logging.LogRecord) -> bool:
        context = _CONTEXT.get()
        if "turn_id" not in context and record.name.startswith("celery."):
            context = _celery_task_fields(record) or context
        for field in CONTEXT_FIELDS:
            value = context.get(field)
            if value is None:
                value = _PROCESS.get(field)
            setattr(record, field, self._missing if value is None else value)
        return True


def _celery_task_fields(record: logging.LogRecord) -> Mapping[str, object] | None:
    """The fields of the task a Celery record is about, when it names one of ours."""
    data = getattr(record, "data", None)  # "received" and "succeeded" pass their context here
    if isinstance(data, dict):
        args = data.get("args")
        if isinstance(args, str) and (match := _ENVELOPE.search(args)):
            return _envelope_fields(match)
    if not isinstance(record.args, tuple):
        return None
    for arg in record.args:  # "Task accepted: %s[%s] pid:%r"; "TaskPool: Apply %s (args:%s ...)" with its repr
        if isinstance(arg, str):
            if (fields := _TASKS.get(arg)) is not None:
                return fields
            if "'turn_id': " in arg and (match := _ENVELOPE.search(arg)):
                return _envelope_fields(match)
    return None


def _envelope_fields(match: re.Match[str]) -> dict[str, object]:
    return {"turn_id": match[1], "step": match[2], "iteration": int(match[3])}
