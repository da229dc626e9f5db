"""WorkerMetrics: what the workers count for Prometheus, each event once, where it happens.

- The driver (:mod:`workers.driver`) counts what a message's steps did once their outcome is saved
  in Redis, the step's commit point (a :class:`MessageTally`): step latency, a model retry, a turn
  committed as ended or paused. A step whose save failed runs again and is counted then; a
  redelivered message whose step already ran is counted as a redelivery, not as a second run. The
  driver also counts every other "run it again later" (:class:`workers.retry.Reason`) when it
  decides it, and a turn it fails outside any step.
- The ``llm_call`` step counts each model call as it returns (latency, outcome, tokens): a call
  made twice was paid for twice.
- The reconciler counts its scans, its re-drives by source, and the turns it gives up on.
- The active admission scheduler (``workers.scheduler``) counts the turns it released or sent again
  after a scheduler died, and shows each organisation's turns held and in flight.

How ``aptix worker`` exports them (:mod:`aptix_cli.metrics_export`): one ``aptix worker`` may be
several Celery processes (one per group of queues, ``aptix_cli.worker_group``), each running tasks
on threads or greenlets, and a prefork pool adds child processes. So every one of them counts in
prometheus_client's multiprocess mode: each process writes its values into memory-mapped files of
its own, in one directory named by ``PROMETHEUS_MULTIPROC_DIR`` (set before prometheus_client is
first imported: the value class is chosen then). ``aptix worker`` makes a fresh directory at each
start, so no value of an earlier run is added in, and one HTTP listener, in the process
``aptix worker`` started (the group's parent, or the Celery worker itself when it is the only
one), sums the files of every process at each scrape, on ``APTIX_WORKER_METRICS_PORT``. Files of
processes that died (a recycled prefork child) are folded into one file per kind at scrape time:
their counts stay in the sums, and the directory does not grow with every child. An event (one
counter increment or histogram observation) costs about 2.6-3.9 µs of CPU in this mode
(``benchmarks/metrics_cost.py``; docs/benchmarks.md, "Metrics"): under 0.5 % of a ~1 ms task.

Outside ``aptix worker`` (tests, ``aptix dev``) the same collectors count in memory, on the
registry given to :class:`WorkerMetrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import urllib3
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.errors import LlmError
from shared.metrics import finished_labels, turns_finished_counter
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, ErrorInfo
from shared.state.token_usage import TurnTokens
from shared.task_names import LAYER_OF, StepName
from workers.retry import Reason

__all__ = ["MessageTally", "WorkerMetrics", "model_outcome"]

_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
"""Seconds: most steps take milliseconds; ``llm_call`` and server tools wait on others."""
_MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds, up to past the default model timeout (120 s)."""
_REDRIVE_SOURCES = ("redis", "checkpoint", "start")
"""Where a re-driven turn's message came from (:func:`workers.reconciler.frontier`)."""


@dataclass(slots=True)
class MessageTally:
    """What the steps of one message did, for the driver to count once their outcome is saved."""

    steps: list[tuple[StepName, float]] = field(default_factory=list)
    """Each step run, with its duration in seconds."""
    retried: tuple[Reason, StepName] | None = None
    """Why and which step was sent again later by its own RetryAfter (the model could not answer)."""
    committed: TurnStatus | None = None
    """The status a ``persist`` step wrote (None when it wrote none: the turn had ended otherwise)."""
    error: ErrorInfo | None = None
    """The error of the committed turn."""
    tokens: TurnTokens | None = None
    """The committed turn's tokens, which the save that ends its chain merges (``Stop.tokens``)."""
    acked: bool = False
    """The save that ended the turn's chain acknowledged the message on Redis (a message that sends on says
    so in ``Dispatch.acked``): Celery's ack of it then skips Redis."""


class WorkerMetrics:
    """The collectors of one worker process.

    Every label value is from a fixed set (steps, reasons, statuses, error codes, outcomes) or the
    model name of a request (from the settings and the mode catalog). The label sets that can be
    known in advance are created at zero, so a series exists before its first event and ``rate()``
    sees that first event.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Create the collectors on ``registry`` (a new one when None)."""
        self.registry = registry or CollectorRegistry()
        """The registry the collectors are on (what a single process serves)."""
        self.turns_finished = turns_finished_counter(self.registry)
        self.turns_paused = Counter(
            "aptix_turns_paused", "Turns committed as waiting for client tools (requires_client_tools), per pause.",
            registry=self.registry,
        )  # fmt: skip
        self.step_seconds = Histogram(
            "aptix_step_seconds", "Time one pipeline step took to run (loading and saving the state excluded).",
            ["layer", "step"], buckets=_STEP_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.steps_redelivered = Counter(
            "aptix_steps_redelivered", "Messages delivered again after their step had run (not run twice).",
            ["step"], registry=self.registry,
        )  # fmt: skip
        self.step_retries = Counter(
            "aptix_step_retries", "Steps sent again later, by reason (model, step_busy, turn_not_recorded, "
            "infrastructure).", ["reason", "step"], registry=self.registry,
        )  # fmt: skip
        self.model_call_seconds = Histogram(
            "aptix_model_call_seconds", "Model (Responses API) calls by outcome: ok, 429, 4xx, 5xx, timeout, "
            "connection_error, bad_response.", ["model", "outcome"], buckets=_MODEL_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.model_tokens = Counter(
            "aptix_model_tokens", "Tokens the model reported, by kind (input, output).", ["model", "kind"],
            registry=self.registry,
        )  # fmt: skip
        self.model_breaker_open = Counter(
            "aptix_model_breaker_open", "Model calls not made because the model's circuit breaker was open.",
            ["model"], registry=self.registry,
        )  # fmt: skip
        self.model_rate_limited = Counter(
            "aptix_model_rate_limited", "Model calls held back by the model's shared rate limits, by reason "
            "(requests, tokens, paused: a 429's Retry-After).", ["model", "reason"], registry=self.registry,
        )  # fmt: skip
        self.reconciler_scans = Counter(
            "aptix_reconciler_scans", "Scans for overdue turns by the active reconciler.", registry=self.registry
        )
        self.reconciler_redrives = Counter(
            "aptix_reconciler_redrives", "Stalled turns the reconciler sent on again, by where their message "
            "came from (redis, checkpoint, start).", ["source"], registry=self.registry,
        )  # fmt: skip
        self.admission_turns = Gauge(
            "aptix_admission_turns", "Turns of each organisation held for admission or in flight (state: held, "
            "in_flight), as the active admission scheduler last saw them.", ["org", "state"],
            registry=self.registry, multiprocess_mode="livemax",
        )  # fmt: skip
        self.admission_released = Counter(
            "aptix_admission_released", "Held batch turns whose first message the admission scheduler sent, by "
            "kind (released; republished: sent again after a scheduler died between release and send).",
            ["kind"], registry=self.registry,
        )  # fmt: skip
        self.admission_window = Gauge(
            "aptix_admission_window", "The most turns the admission window lets be in flight in all, as the active "
            "admission scheduler last sized it (0: no window).", registry=self.registry, multiprocess_mode="livemax",
        )  # fmt: skip
        self.dispatch_delay = Gauge(
            "aptix_admission_dispatch_delay_seconds", "How long step messages waited between their sending and "
            "their task's start (each worker process's shortest of half a second, weighted), as the admission window "
            "last saw it.",
            registry=self.registry, multiprocess_mode="livemax",
        )  # fmt: skip
        self._create_known_series()

    def show_window(self, size: int, delay: float | None) -> None:
        """Set the admission window's gauges: its size, and the dispatch delay it was sized from (0: none reported)."""
        self.admission_window.set(size)
        self.dispatch_delay.set(delay or 0.0)

    def count_released(self, kind: str, turns: int) -> None:
        """Count ``turns`` held turns sent on (``released``, or ``republished`` after a scheduler died)."""
        self.admission_released.labels(kind).inc(turns)

    def show_admission(self, counts: dict[str, tuple[int, int]], *, shown: set[str]) -> set[str]:
        """Set each organisation's held and in-flight gauges; an organisation in ``shown`` but not in ``counts``
        goes to 0. Returns the organisations shown now."""
        for org in shown - counts.keys():
            self.admission_turns.labels(org, "held").set(0)
            self.admission_turns.labels(org, "in_flight").set(0)
        for org, (held, in_flight) in counts.items():
            self.admission_turns.labels(org, "held").set(held)
            self.admission_turns.labels(org, "in_flight").set(in_flight)
        return set(counts)

    def count_message(self, tally: MessageTally) -> None:
        """Count what one message's steps did; the driver calls it once their outcome is saved."""
        for step, seconds in tally.steps:
            self.step_seconds.labels(LAYER_OF[step].value, step.value).observe(seconds)
        if tally.retried is not None:
            reason, step = tally.retried
            self.step_retries.labels(reason.value, step.value).inc()
        if tally.committed is TurnStatus.REQUIRES_CLIENT_TOOLS:
            self.turns_paused.inc()
        elif tally.committed is not None and tally.committed.is_terminal:
            self.turns_finished.labels(*finished_labels(tally.committed, tally.error)).inc()

    def count_retry(self, reason: Reason, step: StepName) -> None:
        """Count ``step`` sent again later for ``reason``."""
        self.step_retries.labels(reason.value, step.value).inc()

    def count_redelivered(self, step: StepName) -> None:
        """Count a message of ``step`` that arrived again after the step had run."""
        self.steps_redelivered.labels(step.value).inc()

    def count_ended(self, status: TurnStatus, error: ErrorInfo | None) -> None:
        """Count a turn this process ended outside a ``persist`` step (after its end was written)."""
        self.turns_finished.labels(*finished_labels(status, error)).inc()

    def count_model_call(
        self,
        model: str,
        *,
        seconds: float,
        error: LlmError | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> None:
        """Count one model call that returned (``error`` None) or failed.

        Args:
            model: the model name the request carried.
            seconds: how long the call took.
            error: what it failed with, if it failed (its outcome label comes from :func:`model_outcome`).
            input_tokens: input tokens the answer reported.
            output_tokens: output tokens the answer reported.
        """
        self.model_call_seconds.labels(model, model_outcome(error)).observe(seconds)
        if input_tokens:
            self.model_tokens.labels(model, "input").inc(input_tokens)
        if output_tokens:
            self.model_tokens.labels(model, "output").inc(output_tokens)

    def count_breaker_open(self, model: str) -> None:
        """Count a model call not made because ``model``'s breaker was open."""
        self.model_breaker_open.labels(model).inc()

    def count_rate_limited(self, model: str, reason: str) -> None:
        """Count a model call held back by ``model``'s shared rate limits (``requests``, ``tokens``, ``paused``)."""
        self.model_rate_limited.labels(model, reason).inc()

    def count_scan(self) -> None:
        """Count one scan of the active reconciler."""
        self.reconciler_scans.inc()

    def count_redrive(self, source: str) -> None:
        """Count one turn re-driven from ``source`` (``redis``, ``checkpoint`` or ``start``)."""
        self.reconciler_redrives.labels(source).inc()

    def _create_known_series(self) -> None:
        self.turns_finished.labels(*finished_labels(TurnStatus.COMPLETED, None))
        for code in ErrorCode:
            if code is not ErrorCode.CANCELLED:  # the gateway writes cancels
                self.turns_finished.labels(TurnStatus.FAILED.value, code.value)
        for step in StepName:
            self.steps_redelivered.labels(step.value)
            for reason in (Reason.STEP_BUSY, Reason.TURN_NOT_RECORDED, Reason.INFRASTRUCTURE):
                self.step_retries.labels(reason.value, step.value)
        self.step_retries.labels(Reason.MODEL.value, StepName.LLM_CALL.value)
        for source in _REDRIVE_SOURCES:
            self.reconciler_redrives.labels(source)
        for kind in ("released", "republished"):
            self.admission_released.labels(kind)


def model_outcome(error: LlmError | None) -> str:
    """The ``outcome`` label of a model call that raised ``error`` (None: ``ok``).

    ``timeout`` and ``connection_error`` when no answer came (the client's transport error is the
    cause), ``429``, ``4xx`` or ``5xx`` by the answer's status, else ``bad_response`` (an answer the
    client could not use: not JSON, a failed or incomplete response, a redirect).
    """
    if error is None:
        return "ok"
    cause = error.__cause__
    # urllib3 makes a refused connection (NewConnectionError) a kind of ConnectTimeoutError.
    if isinstance(cause, urllib3.exceptions.TimeoutError) and not isinstance(
        cause, urllib3.exceptions.NewConnectionError
    ):
        return "timeout"
    if isinstance(cause, urllib3.exceptions.HTTPError):
        return "connection_error"
    if error.status_code == 429:
        return "429"
    if error.status_code >= 500:
        return "5xx"
    if error.status_code >= 400:
        return "4xx"
    return "bad_response"
