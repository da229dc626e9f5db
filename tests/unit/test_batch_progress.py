"""Following a batch: turns in flight, finished and out of flight, and the poll loop."""

from __future__ import annotations

import io
from typing import Any

from aptix_cli.batch_progress import finished, follow_batch, in_flight, out_of_flight
from aptix_cli.progress import ProgressBar


class _Batches:
    """Answers ``get_batch`` with the given bodies, one per call."""

    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.bodies = bodies
        self.asked: list[str] = []

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        self.asked.append(batch_id)
        return self.bodies.pop(0)


def _batch(total: int, **counts: int) -> dict[str, Any]:
    return {"batch_id": "b1", "total": total, "counts": counts}


def test_a_turn_paused_for_client_tools_is_out_of_flight_but_not_finished() -> None:
    batch = _batch(10, completed=5, failed=1, cancelled=1, requires_client_tools=1, running=1, queued=1)
    assert in_flight(batch["counts"]) == 2
    assert out_of_flight(batch) == 8
    assert finished(batch["counts"]) == 7


def test_follow_batch_polls_until_nothing_is_in_flight_and_returns_the_last_body() -> None:
    # Given a batch that moves from 2 queued to 1 running to done
    batches = _Batches([_batch(2, completed=1, running=1), _batch(2, completed=2)])
    stream = io.StringIO()
    bar = ProgressBar(stream, total=2, tty=False, interval=0.0)

    # When it is followed
    last = follow_batch(batches, _batch(2, queued=2), interval=0.0, bar=bar)

    # Then it polled twice, drew the bar before each poll, and returned the done batch
    assert batches.asked == ["b1", "b1"]
    assert last["counts"] == {"completed": 2}
    assert [line.split()[1] for line in stream.getvalue().splitlines()] == ["0/2", "1/2"]


def test_follow_batch_does_not_poll_a_batch_already_done() -> None:
    batches = _Batches([])
    assert follow_batch(batches, _batch(1, failed=1), interval=0.0)["counts"] == {"failed": 1}
    assert batches.asked == []
