"""Every task's string name and the queue it runs on.

A task runs one pipeline *layer* (AGN-027): the AGN-032 entry steps (request handler, session creator /
restorer / client-tool session restorer, session context resolver, context provider initializer,
client-tool continuation resolver) are one layer, Pipeline Entry, run by one task; the reasoner,
composition, LLM call, server tool execution and persistence are a layer and a task each. Where a task
ends is :class:`TaskBoundaries`' choice: at every layer, only where the queue changes, or only before a
call (the model's, a server tool's: the default). The gateway sends tasks by these names and never
imports ``workers``; the workers register their tasks under them. Routing is by name (:func:`step_queue`: the
entry's, under ``call``, goes with the model call), so each queue scales on its own. One task is not a
pipeline step: ``aptix.webhook.deliver`` makes one attempt at delivering a signed webhook, on its own queue.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "DEFAULT_TASK_BOUNDARIES",
    "LAYER_OF",
    "TASK_QUEUES",
    "WEBHOOK_TASK",
    "Layer",
    "Queue",
    "StepName",
    "TaskBoundaries",
    "entry_call_after",
    "same_task",
    "step_queue",
    "task_name",
]


class Queue(StrEnum):
    """The broker queues."""

    PIPELINE = "pipeline"
    """Cheap CPU steps."""
    LLM = "llm"
    """I/O-bound LLM calls."""
    TOOLS = "tools"
    """Server tools."""
    WEBHOOKS = "webhooks"
    """Webhook deliveries: I/O-bound POSTs to the clients' endpoints, apart from the turns."""


class StepName(StrEnum):
    """The pipeline steps (AGN-032 map plus the reasoner's inner layers), named as in ARCHITECTURE.md."""

    REQUEST_HANDLER = "request_handler"
    SESSION_CREATOR = "session_creator"
    SESSION_RESTORER = "session_restorer"
    CLIENT_TOOL_SESSION_RESTORER = "client_tool_session_restorer"
    SESSION_CONTEXT_RESOLVER = "session_context_resolver"
    CONTEXT_PROVIDER_INITIALIZER = "context_provider_initializer"
    CLIENT_TOOL_CONTINUATION_RESOLVER = "client_tool_continuation_resolver"
    REASONER = "reasoner"
    COMPOSE = "compose"
    LLM_CALL = "llm_call"
    EXECUTE_SERVER_TOOLS = "execute_server_tools"
    PERSIST = "persist"


class Layer(StrEnum):
    """The pipeline layers, one task each."""

    ENTRY = "entry"
    REASONER = "reasoner"
    COMPOSE = "compose"
    LLM_CALL = "llm_call"
    EXECUTE_SERVER_TOOLS = "execute_server_tools"
    PERSIST = "persist"


_ENTRY_STEPS = frozenset(
    {
        StepName.REQUEST_HANDLER,
        StepName.SESSION_CREATOR,
        StepName.SESSION_RESTORER,
        StepName.CLIENT_TOOL_SESSION_RESTORER,
        StepName.SESSION_CONTEXT_RESOLVER,
        StepName.CONTEXT_PROVIDER_INITIALIZER,
        StepName.CLIENT_TOOL_CONTINUATION_RESOLVER,
    }
)
LAYER_OF: dict[StepName, Layer] = {
    step: Layer.ENTRY if step in _ENTRY_STEPS else Layer(step.value) for step in StepName
}
"""Step -> the layer (and so the task) that runs it."""


def task_name(step: StepName) -> str:
    """The Celery task name of the layer that runs ``step``: ``aptix.step.<layer>``."""
    return f"aptix.step.{LAYER_OF[step].value}"


_QUEUE_OF_LAYER = {Layer.LLM_CALL: Queue.LLM, Layer.EXECUTE_SERVER_TOOLS: Queue.TOOLS}

WEBHOOK_TASK = "aptix.webhook.deliver"
"""The task that makes one attempt at delivering one webhook."""

TASK_QUEUES: dict[str, Queue] = {
    **{f"aptix.step.{layer.value}": _QUEUE_OF_LAYER.get(layer, Queue.PIPELINE) for layer in Layer},
    WEBHOOK_TASK: Queue.WEBHOOKS,
}
"""Task name -> queue: the routing table both the gateway and the workers use."""


class TaskBoundaries(StrEnum):
    """Where a task ends and the next message starts (``APTIX_TASK_BOUNDARIES``).

    A hop (a Celery message) costs about the CPU of a step itself, and buys something only where the
    work changes queue (another pool, another process, scaled on its own). Either way every layer is
    its own step: the step map, the leases, the idempotency keys and the trace are the same; only
    which of the steps share one task changes.
    """

    LAYER = "layer"
    """A task per layer (the AGN-032 entry steps one layer): Flower shows every layer as a task of its own."""
    QUEUE = "queue"
    """A task per run of steps on one queue: the reasoner runs the composition (and, at the end, the
    persistence) in its own task, so a plain turn is 3 hops instead of 6 and a server-tool turn 7 instead of 11."""
    CALL = "call"
    """A task per call: a message goes only to a step that waits on the world outside, on a queue of its own
    (the model call, the server tools); the pipeline's own steps (reasoner, composition, persistence) run in
    the task before them, wherever that is. A round's entry goes on the model call's queue and its task runs
    the round's first call too (:func:`step_queue`). A plain turn is 1 hop, a server-tool turn 3."""


DEFAULT_TASK_BOUNDARIES = TaskBoundaries.CALL
"""``APTIX_TASK_BOUNDARIES`` unset: a task per call, the fewest hops (docs/pipeline.md, "Task boundaries")."""


def step_queue(step: StepName, boundaries: TaskBoundaries) -> Queue:
    """The queue a message for ``step`` goes on: its task's route (:data:`TASK_QUEUES`), except a round's entry
    under :attr:`TaskBoundaries.CALL`: the model call's queue, where its task runs on into the round's first
    call (the entry's steps are short CPU and a few writes; a hop of their own cost the turn as much again)."""
    if boundaries is TaskBoundaries.CALL and LAYER_OF[step] is Layer.ENTRY:
        return Queue.LLM
    return TASK_QUEUES[task_name(step)]


def same_task(step: StepName, following: StepName, boundaries: TaskBoundaries, *, entry_call: bool = False) -> bool:
    """Whether ``following``, the step after ``step``, runs in the same task (no message between them).

    ``entry_call``: the task began at a round's entry on the model call's queue (:func:`step_queue`) and has made
    no call yet; under :attr:`TaskBoundaries.CALL` it runs the model call that follows (one call per task still:
    the steps after that call go on as in any task that made one).
    """
    if boundaries is TaskBoundaries.LAYER:
        return LAYER_OF[step] is LAYER_OF[following]
    queue = TASK_QUEUES[task_name(following)]
    if boundaries is TaskBoundaries.CALL and (queue is Queue.PIPELINE or (entry_call and queue is Queue.LLM)):
        return True
    return queue is TASK_QUEUES[task_name(step)]


def entry_call_after(step: StepName, entry_call: bool) -> bool:
    """:func:`same_task`'s ``entry_call`` once ``step`` ran in the task: a model call spends it (one call a task)."""
    return entry_call and LAYER_OF[step] is not Layer.LLM_CALL
