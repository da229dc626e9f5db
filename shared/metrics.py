"""Metrics both sides of Aptix export under one name, so one PromQL expression sums them.

A turn ends where its end is written: in the worker whose ``persist`` step commits it (completed,
failed, or paused for client tools), in the worker or reconciler that fails it from outside the
pipeline, or in the gateway (a client's cancel, a client-tool timeout). Each of those processes
counts the ends it wrote itself, on the same counter: summed over every job (``sum by (status, code)
(rate(aptix_turns_finished_total[5m]))``), it counts each ended turn once.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from shared.models.turn import TurnStatus
from shared.result import ErrorInfo

__all__ = ["TURNS_FINISHED", "finished_labels", "turns_finished_counter"]

TURNS_FINISHED = "aptix_turns_finished"
"""The counter of ended turns (exported as ``aptix_turns_finished_total{status, code}``)."""


def turns_finished_counter(registry: CollectorRegistry) -> Counter:
    """The counter of ended turns, on ``registry``.

    Labels: ``status`` (``completed``, ``failed``, ``cancelled``) and ``code`` (the turn's error
    code, e.g. ``llm_error``; empty for a completed turn).
    """
    return Counter(
        TURNS_FINISHED,
        "Turns that ended, by final status and error code (empty when completed); counted once, by the "
        "process that wrote the end.",
        ["status", "code"],
        registry=registry,
    )


def finished_labels(status: TurnStatus, error: ErrorInfo | None) -> tuple[str, str]:
    """The ``(status, code)`` labels of a turn that ended with ``status`` and ``error``."""
    return status.value, "" if error is None else error.code.value
