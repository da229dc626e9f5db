"""THE step map (AGN-032 §4, ARCHITECTURE.md "The turn, step by step"): step -> function, next steps.

The queue of each step comes from :data:`shared.task_names.TASK_QUEUES`. The driver refuses a move
this table does not allow. ``persist`` is reachable from every step: a failure at any point is
committed there (AGN-027 §5), so it is listed once in :data:`ALWAYS_ALLOWED`. After a step marked
``checkpoint`` moves on, the driver writes the turn's state to the database before that step's task
ends, unless the task went on to the turn's commit, which writes it (and in Redis with the task's last
save, or at once when a later step of its task meets trouble): the points that cannot be cheaply redone
(a model's answer). The turn's
start (``request_handler`` marks it running), each server tool's start and outcome
(``execute_server_tools``) and each commit (``persist``) are durable by themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.models.envelope import TurnEnvelope
from shared.result import InvokeResult
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Next
from workers.steps import (
    client_tool_continuation_resolver,
    client_tool_session_restorer,
    compose,
    context_provider_initializer,
    execute_server_tools,
    llm_call,
    persist,
    reasoner,
    request_handler,
    session_context_resolver,
    session_creator,
    session_restorer,
)

__all__ = ["ALWAYS_ALLOWED", "STEP_MAP", "StepFunction", "StepSpec"]

StepFunction = Callable[[StepContext, TurnEnvelope, TurnState], InvokeResult[Next]]


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One row of the step map."""

    run: StepFunction
    next: frozenset[StepName]
    checkpoint: bool = False


def _spec(run: StepFunction, *next_steps: StepName, checkpoint: bool = False) -> StepSpec:
    return StepSpec(run, frozenset(next_steps), checkpoint)


ALWAYS_ALLOWED = frozenset({StepName.PERSIST})

STEP_MAP: dict[StepName, StepSpec] = {
    StepName.REQUEST_HANDLER: _spec(
        request_handler.run, StepName.SESSION_CREATOR, StepName.SESSION_RESTORER, StepName.CLIENT_TOOL_SESSION_RESTORER
    ),
    StepName.SESSION_CREATOR: _spec(session_creator.run, StepName.SESSION_CONTEXT_RESOLVER),
    StepName.SESSION_RESTORER: _spec(session_restorer.run, StepName.SESSION_CONTEXT_RESOLVER),
    StepName.CLIENT_TOOL_SESSION_RESTORER: _spec(client_tool_session_restorer.run, StepName.SESSION_CONTEXT_RESOLVER),
    StepName.SESSION_CONTEXT_RESOLVER: _spec(session_context_resolver.run, StepName.CONTEXT_PROVIDER_INITIALIZER),
    StepName.CONTEXT_PROVIDER_INITIALIZER: _spec(
        context_provider_initializer.run, StepName.REASONER, StepName.CLIENT_TOOL_CONTINUATION_RESOLVER
    ),
    StepName.CLIENT_TOOL_CONTINUATION_RESOLVER: _spec(client_tool_continuation_resolver.run, StepName.REASONER),
    StepName.REASONER: _spec(reasoner.run, StepName.COMPOSE, StepName.EXECUTE_SERVER_TOOLS),
    StepName.EXECUTE_SERVER_TOOLS: _spec(execute_server_tools.run, StepName.REASONER),
    StepName.COMPOSE: _spec(compose.run, StepName.LLM_CALL),
    StepName.LLM_CALL: _spec(llm_call.run, StepName.REASONER, checkpoint=True),
    StepName.PERSIST: _spec(persist.run),
}
"""Every step the pipeline runs, with the steps it may send the turn to."""
