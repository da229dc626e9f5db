"""Following a batch of turns through its counts by status (``GET /v1/batches/{id}``).

The demo, ``aptix batch submit --wait``, ``aptix bench --embedded`` and the production bench all
watch a batch this way. Two kinds of "done" exist, and the names say which:

- *out of flight* (:func:`out_of_flight`): the gateway no longer works on the turn; it is neither
  queued nor running (:data:`IN_FLIGHT`). A turn paused for client tools counts: only the client
  can move it on. :func:`follow_batch` waits for every turn to be out of flight.
- *finished* (:func:`finished`): the turn is terminal (:meth:`TurnStatus.is_terminal`). The bench
  answers client tools itself, so it waits for this.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from aptix_cli.progress import ProgressBar
from shared.models.turn import TurnStatus

__all__ = ["IN_FLIGHT", "BatchReader", "finished", "follow_batch", "in_flight", "out_of_flight"]

IN_FLIGHT = TurnStatus.in_flight()
"""Statuses the gateway's workers are still working on (queued, running)."""


class BatchReader(Protocol):
    """What :func:`follow_batch` needs of the gateway (``aptix_cli.client.ApiClient`` has it)."""

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        """``GET /v1/batches/{batch_id}``: the ``Batch`` with its counts by status."""
        ...


def in_flight(counts: Mapping[str, int]) -> int:
    """Turns queued or running, from a batch's counts by status."""
    return sum(int(counts.get(status, 0)) for status in IN_FLIGHT)


def finished(counts: Mapping[str, int]) -> int:
    """Turns in a terminal status (completed, failed, cancelled), from a batch's counts by status."""
    return sum(int(counts.get(status, 0)) for status in TurnStatus.terminal())


def out_of_flight(batch: Mapping[str, Any]) -> int:
    """A ``Batch`` body's turns that are neither queued nor running: its total less :func:`in_flight`."""
    return int(batch.get("total", 0)) - in_flight(batch.get("counts", {}))


def follow_batch(
    api: BatchReader, batch: dict[str, Any], *, interval: float, bar: ProgressBar | None = None
) -> dict[str, Any]:
    """Poll a batch until none of its turns is in flight.

    Args:
        api: The gateway.
        batch: The ``Batch`` body the submission (or an earlier poll) returned.
        interval: Seconds between two polls.
        bar: Updated with :func:`out_of_flight` before each wait; not finished here (the caller
            does that, and may interrupt it when a poll fails).

    Returns:
        The last ``Batch`` body, with nothing in flight.
    """
    while in_flight(batch.get("counts", {})):
        if bar is not None:
            bar.update(out_of_flight(batch), batch.get("counts", {}))
        time.sleep(interval)
        batch = api.get_batch(str(batch["batch_id"]))
    return batch
