"""Telemetry: the OpenTelemetry side of ``shared.telemetry`` (imported only when telemetry is on).

A turn's trace id is its turn id and its root span id the turn id's low 64 bits (the reasons are
in ``shared.telemetry``). :class:`_TurnIds` gives a root span those ids when one was reserved for
it (:func:`reserved_root`); every other span gets random ids, as usual.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery import signals
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from shared.task_names import TASK_QUEUES

__all__ = ["Telemetry", "reserved_root", "root_traceparent", "turn_ids"]

_TURN_ID = re.compile(r"^turn_([0-9a-f]{32})$")
_LOW_64_BITS = (1 << 64) - 1


def turn_ids(turn_id: str) -> tuple[int, int]:
    """The turn's trace id and its root span's id.

    ``turn_<32 hex>`` is the trace id itself; any other id is hashed (SHA-256) into one.
    """
    match = _TURN_ID.match(turn_id)
    digest = match[1] if match else hashlib.sha256(turn_id.encode()).hexdigest()[:32]
    trace_id = int(digest, 16) or 1
    return trace_id, (trace_id & _LOW_64_BITS) or 1


def root_traceparent(turn_id: str) -> str:
    """A W3C ``traceparent`` whose parent is the turn's root span (sampled)."""
    trace_id, span_id = turn_ids(turn_id)
    return f"00-{trace_id:032x}-{span_id:016x}-01"


@contextmanager
def reserved_root(turn_id: str) -> Iterator[None]:
    """The next root span started inside gets the turn's trace and root span ids."""
    token = _RESERVED.set(_Reserved(*turn_ids(turn_id)))
    try:
        yield
    finally:
        _RESERVED.reset(token)


class Telemetry:
    """The process's tracer provider, its Celery instrumentation and the turn-trace helpers."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("aptix")

    @classmethod
    def start(cls, *, service_name: str, exporter: SpanExporter | None = None) -> Telemetry:
        """Build the provider (OTLP/HTTP exporter unless ``exporter``) and instrument Celery.

        Args:
            service_name: the service name unless ``OTEL_SERVICE_NAME`` is set.
            exporter: export to this, each span as it ends, instead of batches to OTLP.
        """
        resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service_name})
        provider = TracerProvider(resource=resource, id_generator=_TurnIds())
        processor: SpanProcessor
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processor = BatchSpanProcessor(OTLPSpanExporter())
        else:
            processor = SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(provider)  # for any other instrumented library in the process
        telemetry = cls(provider)
        # Ours first: a message without trace headers gets the turn's root before Celery's span starts.
        signals.task_prerun.connect(_adopt_turn_spans, weak=False, dispatch_uid="aptix-adopt-turn-spans")
        CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]  # untyped package
        signals.task_prerun.connect(_label_task_span, weak=False, dispatch_uid="aptix-label-task-span")
        return telemetry

    def stop(self) -> None:
        """Remove the Celery instrumentation, export what is pending and shut the provider down."""
        CeleryInstrumentor().uninstrument()  # type: ignore[no-untyped-call]  # untyped package
        signals.task_prerun.disconnect(dispatch_uid="aptix-adopt-turn-spans")
        signals.task_prerun.disconnect(dispatch_uid="aptix-label-task-span")
        self.provider.shutdown()

    @contextmanager
    def turn_spans(self, turn_id: str) -> Iterator[None]:
        """The block runs in the turn's trace: as is if it does already, else under the turn's root."""
        trace_id, span_id = turn_ids(turn_id)
        if trace.get_current_span().get_span_context().trace_id == trace_id:
            yield
            return
        root = SpanContext(trace_id, span_id, is_remote=True, trace_flags=self._flags(trace_id))
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(root)))
        try:
            yield
        finally:
            otel_context.detach(token)

    @contextmanager
    def turn_span(self, turn_id: str, name: str, attributes: Mapping[str, str | int]) -> Iterator[None]:
        """The block as a span ``name`` in the turn's trace."""
        with (
            self.turn_spans(turn_id),
            self.tracer.start_as_current_span(name, attributes={"aptix.turn_id": turn_id, **attributes}),
        ):
            yield

    @contextmanager
    def turn_accepted(self, turn_id: str) -> Iterator[None]:
        """The turn's root span around the block, linked to the current span, unless already in its trace."""
        current = trace.get_current_span().get_span_context()
        if current.trace_id == turn_ids(turn_id)[0]:
            yield
            return
        links = [trace.Link(current)] if current.is_valid else []
        with reserved_root(turn_id):
            span = self.tracer.start_span(
                "turn accepted", context=otel_context.Context(), links=links, attributes={"aptix.turn_id": turn_id}
            )
        with trace.use_span(span, end_on_exit=True):
            yield

    def _flags(self, trace_id: int) -> TraceFlags:
        # The decision the sampler made, or would make, for the turn's root: every span of a turn is
        # sampled or none is, however it entered the trace.
        decision = self.provider.sampler.should_sample(None, trace_id, "turn").decision
        return TraceFlags(TraceFlags.SAMPLED if decision is Decision.RECORD_AND_SAMPLE else TraceFlags.DEFAULT)


@dataclass
class _Reserved:
    trace_id: int
    span_id: int
    used: bool = False


_RESERVED: contextvars.ContextVar[_Reserved | None] = contextvars.ContextVar("aptix_reserved_root", default=None)


class _TurnIds(RandomIdGenerator):
    """Random ids, except for the one root span a turn reserved (:func:`reserved_root`)."""

    def generate_trace_id(self) -> int:
        reserved = _RESERVED.get()
        if reserved is not None and not reserved.used:
            return reserved.trace_id
        return super().generate_trace_id()

    def generate_span_id(self) -> int:
        # The SDK asks for a root span's trace id, then its span id: this one is the reserved root.
        reserved = _RESERVED.get()
        if reserved is not None and not reserved.used:
            reserved.used = True
            return reserved.span_id
        return super().generate_span_id()


def _adopt_turn_spans(task: Any = None, args: Any = None, **_kwargs: Any) -> None:
    """A step task whose message came without trace headers runs under its turn's root."""
    if task is None or task.name not in TASK_QUEUES or getattr(task.request, "traceparent", None):
        return
    turn_id = _turn_id_of(args)
    if turn_id is not None:
        task.request.traceparent = root_traceparent(turn_id)  # where the instrumentation looks for it


def _label_task_span(task: Any = None, args: Any = None, **_kwargs: Any) -> None:
    """Name the turn and step on a step task's span (the instrumentation has made it current)."""
    if task is None or task.name not in TASK_QUEUES:
        return
    span = trace.get_current_span()
    payload = args[0] if isinstance(args, list | tuple) and args else None
    if span.is_recording() and isinstance(payload, dict):
        span.set_attribute("aptix.turn_id", str(payload.get("turn_id")))
        span.set_attribute("aptix.step", str(payload.get("step")))


def _turn_id_of(args: Any) -> str | None:
    payload = args[0] if isinstance(args, list | tuple) and args else None
    turn_id = payload.get("turn_id") if isinstance(payload, dict) else None
    return turn_id if isinstance(turn_id, str) else None
