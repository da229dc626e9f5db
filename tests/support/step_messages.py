"""Step messages as they lie on a Redis broker, sent by Celery's ``send_task`` and by ``shared.step_sender``.

The identity tests (``tests/integration/test_broker_transport.py``, and with telemetry on
``test_telemetry_spans.py``) send the same envelopes both ways and compare the raw bytes.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime

import redis
from celery import Celery

from shared.models.envelope import TurnEnvelope
from shared.state import MemoryStateStore
from shared.step_sender import SENT_AT_HEADER, CeleryBroker, StepSender
from shared.task_names import DEFAULT_TASK_BOUNDARIES, StepName, step_queue, task_name

__all__ = ["ENVELOPES", "envelope_of", "messages", "send_task", "step_sender", "without_ids"]

ENVELOPES = [
    TurnEnvelope(turn_id="turn_" + "a" * 32, step=StepName.REQUEST_HANDLER, priority=9),
    TurnEnvelope(turn_id="turn_" + "b" * 32, step=StepName.REASONER, round=1, hop=5, iteration=2, priority=3),
    TurnEnvelope(turn_id="turn_" + "c" * 32, step=StepName.LLM_CALL, hop=6, iteration=1, attempt=4),
    TurnEnvelope(turn_id="turn_" + "d" * 32, step=StepName.EXECUTE_SERVER_TOOLS, hop=8, iteration=1, priority=3),
    TurnEnvelope(turn_id="turn_" + "e" * 32, step=StepName.PERSIST, hop=13, iteration=2),
]
"""An envelope of each queue, at several priorities, each of a turn of its own."""


def step_sender(app: Celery) -> StepSender:
    """A step sender on ``app`` (no publish retries; nothing is parked unless a countdown passes 30 s)."""
    return StepSender(CeleryBroker(app, retry=False), timers=MemoryStateStore(), park_after=30)


def send_task(app: Celery, envelope: TurnEnvelope, countdown: float = 0.0) -> None:
    """The envelope through Celery's own ``send_task``, the way a task is sent by name to its step's queue
    (under the default ``APTIX_TASK_BOUNDARIES``), with the one header the step sender adds
    (:data:`~shared.step_sender.SENT_AT_HEADER`)."""
    name = task_name(envelope.step)
    app.send_task(
        name,
        args=[envelope.model_dump(mode="json")],
        queue=step_queue(envelope.step, DEFAULT_TASK_BOUNDARIES).value,
        countdown=countdown or None,
        priority=envelope.priority,
        headers={SENT_AT_HEADER: time.time() + countdown},
    )


def messages(broker_url: str, envelope: TurnEnvelope) -> list[bytes]:
    """The raw messages of ``envelope``'s turn on the broker, in the order they were sent."""
    queue = step_queue(envelope.step, DEFAULT_TASK_BOUNDARIES).value
    key = queue if envelope.priority == 0 else f"{queue}\x06\x16{envelope.priority}"
    raws = reversed(redis.Redis.from_url(broker_url).lrange(key, 0, -1))
    return [raw for raw in raws if envelope.turn_id in json.loads(raw)["headers"]["argsrepr"]]


def envelope_of(raw: bytes) -> TurnEnvelope:
    """The envelope a raw step message carries (its body's only argument)."""
    body = json.loads(base64.b64decode(json.loads(raw)["body"]))
    return TurnEnvelope.model_validate(body[0][0])


def without_ids(raw: bytes, *, ids: tuple[str, ...] = ()) -> bytes:
    """The raw message with what each message has of its own written as placeholders: its task id,
    delivery tag, ETA and sending time (each checked to be about now), and the headers named in ``ids``."""
    message = json.loads(raw)
    headers, properties = message["headers"], message["properties"]
    if headers["eta"] is not None:
        assert abs(datetime.fromisoformat(headers["eta"]).timestamp() - time.time()) < 30
        raw = raw.replace(headers["eta"].encode(), b"ETA")
    sent_at = headers[SENT_AT_HEADER]
    assert abs(sent_at - time.time()) < 30
    raw = raw.replace(f'"{SENT_AT_HEADER}": {sent_at!r}'.encode(), b'"SENT_AT"')
    for unique in (headers["id"], properties["delivery_tag"], *(headers[header] for header in ids)):
        raw = raw.replace(unique.encode(), b"UNIQUE")
    return raw
