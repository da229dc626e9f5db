"""THE step map (AGN-032 §4, ARCHITECTURE.md "The turn, step by step"): step -> function, next steps.

The queue of each step comes from :data:`shared.task_names.TASK_QUEUES`. The driver refuses a move
this table does not allow. ``persist`` is reachable from every step: a failure at any point is
committed there (AGN-027 §5), so it is listed once in :data:`ALWAYS_ALLOWED`. After a step marked
``checkpoint`` moves on, the driver writes the turn's state to the database: the points that cannot
be cheaply redone (a model's answer). The turn's start (``request_handler`` marks it running), each
server tool's start and outcome (``execute_server_tools``) and each commit (``persist``) are durable
by themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.models.envelope import TurnEnvelope
from shared.result import InvokeResult
from shared.state import TurnState
from shared.task_names import StepName as S
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
    next: frozenset[S]
    checkpoint: bool = False


def _spec(run: StepFunction, *next_steps: S, checkpoint: bool = False) -> StepSpec:
    return StepSpec(run, frozenset(next_steps), checkpoint)


ALWAYS_ALLOWED = frozenset({S.PERSIST})

STEP_MAP: dict[S, StepSpec] = {
    S.REQUEST_HANDLER: _spec(
        request_handler.run, S.SESSION_CREATOR, S.SESSION_RESTORER, S.CLIENT_TOOL_SESSION_RESTORER
    ),
    S.SESSION_CREATOR: _spec(session_creator.run, S.SESSION_CONTEXT_RESOLVER),
    S.SESSION_RESTORER: _spec(session_restorer.run, S.SESSION_CONTEXT_RESOLVER),
    S.CLIENT_TOOL_SESSION_RESTORER: _spec(client_tool_session_restorer.run, S.SESSION_CONTEXT_RESOLVER),
    S.SESSION_CONTEXT_RESOLVER: _spec(session_context_resolver.run, S.CONTEXT_PROVIDER_INITIALIZER),
    S.CONTEXT_PROVIDER_INITIALIZER: _spec(
        context_provider_initializer.run, S.REASONER, S.CLIENT_TOOL_CONTINUATION_RESOLVER
    ),
    S.CLIENT_TOOL_CONTINUATION_RESOLVER: _spec(client_tool_continuation_resolver.run, S.REASONER),
    S.REASONER: _spec(reasoner.run, S.COMPOSE, S.EXECUTE_SERVER_TOOLS),
    S.EXECUTE_SERVER_TOOLS: _spec(execute_server_tools.run, S.REASONER),
    S.COMPOSE: _spec(compose.run, S.LLM_CALL),
    S.LLM_CALL: _spec(llm_call.run, S.REASONER, checkpoint=True),
    S.PERSIST: _spec(persist.run),
}
"""Every step the pipeline runs, with the steps it may send the turn to."""
