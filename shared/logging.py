"""Logging set-up and the turn/session log context stamped on every record."""

from __future__ import annotations

import contextvars
import logging
import logging.config
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

__all__ = ["configure_logging", "log_context"]

_CONTEXT: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "aptix_log_context", default=MappingProxyType({})
)
_FIELDS = ("turn_id", "session_id", "step", "iteration")


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Stamp ``fields`` (turn_id, session_id, step, iteration) on the records logged inside."""
    token = _CONTEXT.set({**_CONTEXT.get(), **fields})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        context = _CONTEXT.get()
        for field in _FIELDS:
            setattr(record, field, context.get(field, "-"))
        return True


def configure_logging(level: str = "INFO", *, secrets: Iterable[str] = ()) -> None:
    """Configure the root logger once, at an entrypoint.

    Args:
        level: the root level.
        secrets: values no log line may show (:func:`shared.redaction.secrets_in`); redacted from
            every record's message and traceback.
    """
    from shared.redaction import RedactingFilter  # imports settings: only when logging is set up

    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "filters": {
                "context": {"()": _ContextFilter},
                "redact": {"()": RedactingFilter, "secrets": tuple(secrets)},
            },
            "formatters": {
                "plain": {"format": "%(asctime)s %(levelname)s %(name)s [turn=%(turn_id)s step=%(step)s] %(message)s"}
            },
            "handlers": {
                "stderr": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["context", "redact"]}
            },
            "root": {"level": level, "handlers": ["stderr"]},
        }
    )
