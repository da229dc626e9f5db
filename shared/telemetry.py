"""Optional OpenTelemetry spans: each turn is one trace, across the gateway and every task it runs.

Off by default. ``APTIX_OTEL_ENABLED=1`` turns it on in each process that has it
(:func:`start_telemetry`: the gateway's ``create_app``, each worker at ``worker_init``, ``aptix
reconciler``); spans go to the OTLP/HTTP endpoint of ``OTEL_EXPORTER_OTLP_ENDPOINT``, under
``OTEL_SERVICE_NAME`` (default ``aptix-gateway``, ``aptix-worker``, ``aptix-reconciler``). Off,
Aptix imports nothing of OpenTelemetry (its trace SDK, exporter and instrumentations stay
unloaded: ``shared.telemetry_sdk`` holds all of that), and each helper below costs one global read.

How one turn stays one trace. **A turn's trace id is its turn id**: ``turn_<32 hex>`` is 128 random
bits, the size of a trace id, so turn ``turn_0af7…`` is trace ``0af7…`` (an id of another shape is
hashed); the trace's root span id is the turn id's low 64 bits. Every process can therefore put a
span into a turn's trace from the turn id alone:

- The gateway reserves a new turn's id before the request span of ``POST /v1/turns`` starts, and
  that span is created with the turn's trace and root span ids: it is the root. Every later request
  on ``/v1/turns/{turn_id}…`` (tool results, long-polls, cancel, trace) is a child of that root
  (``api_gateway.telemetry``).
- Between tasks the context travels in each Celery message's headers
  (``opentelemetry-instrumentation-celery``): a task span is the child of the publish span of the
  step that sent it, which is the child of that step's task span.
- Every message is sent through ``shared.step_sender.StepSender``, under :func:`turn_spans`: a
  message sent from outside the turn's trace (a reconciler re-drive, a parked retry a reconciler
  thread releases, a batch's turns, whose request is a trace of its own) goes out under the turn's
  root.
- A message that arrives without trace headers (its sender had telemetry off) still runs under the
  turn's root.

Why derive rather than store the context in the turn's state or row: a turn re-enters (client tool
results), is carried on from a database checkpoint, or re-driven by the reconciler after Redis lost
its state, and each path would need to read a stored context back (a column, a write at acceptance,
a read on every path); derived, it costs nothing and cannot be lost, least of all in the re-drive
case that telemetry is most wanted for. The price: a client's own ``traceparent`` on a turn request
cannot make the turn part of the client's trace; the gateway's span keeps it as a link.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from shared.settings import Settings

if TYPE_CHECKING:
    from shared.telemetry_sdk import Telemetry

__all__ = [
    "active_telemetry",
    "start_telemetry",
    "stop_telemetry",
    "turn_accepted",
    "turn_span",
    "turn_spans",
]

_telemetry: Telemetry | None = None


def start_telemetry(settings: Settings, *, service_name: str, exporter: Any = None) -> Telemetry:
    """Start telemetry in this process (once; a second call returns the first one's :class:`Telemetry`).

    Sets up the tracer provider (the global one too, when none was set) with the turn-derived ids,
    and instruments Celery, so every message sent carries its trace context and every task runs
    in it. The gateway also instruments its app (``api_gateway.telemetry``).

    Args:
        settings: the process settings (``otel_enabled`` is the caller's to check).
        service_name: the service spans are reported under unless ``OTEL_SERVICE_NAME`` is set.
        exporter: a span exporter to use instead of OTLP, each span exported as it ends (tests).

    Returns:
        The process's telemetry.
    """
    global _telemetry
    if _telemetry is None:
        from shared.telemetry_sdk import Telemetry

        _telemetry = Telemetry.start(service_name=service_name, exporter=exporter)
    return _telemetry


def stop_telemetry() -> None:
    """Flush and stop this process's telemetry and remove the Celery instrumentation (tests)."""
    global _telemetry
    telemetry, _telemetry = _telemetry, None
    if telemetry is not None:
        telemetry.stop()


def active_telemetry() -> Telemetry | None:
    """This process's telemetry, or None when it is off."""
    return _telemetry


def turn_spans(turn_id: str) -> AbstractContextManager[None]:
    """Run the block in the turn's trace: as is inside it already, else under the turn's root span.

    Args:
        turn_id: the turn.
    """
    if _telemetry is None:
        return nullcontext()
    return _telemetry.turn_spans(turn_id)


@contextmanager
def turn_span(turn_id: str, name: str, **attributes: str | int) -> Iterator[None]:
    """Record the block as a span named ``name`` in the turn's trace (nothing when telemetry is off).

    Args:
        turn_id: the turn.
        name: the span's name.
        **attributes: the span's attributes.
    """
    if _telemetry is None:
        yield
        return
    with _telemetry.turn_span(turn_id, name, attributes):
        yield


def turn_accepted(turn_id: str) -> AbstractContextManager[None]:
    """Start the turn's trace, unless the block already runs in it (the request that created it).

    A batch's turns are accepted by one request, a trace of its own: each turn's root is a span of
    its own, linked to that request's.

    Args:
        turn_id: the turn just accepted.
    """
    if _telemetry is None:
        return nullcontext()
    return _telemetry.turn_accepted(turn_id)
