"""Every task's string name and the queue it runs on.

The gateway sends tasks by these names and never imports ``workers``; the workers register their
tasks under them. Routing is by name, so each queue scales on its own.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Queue", "StepName", "TASK_QUEUES", "task_name"]


class Queue(StrEnum):
    """The broker queues."""

    PIPELINE = "pipeline"
    """Cheap CPU steps."""
    LLM = "llm"
    """I/O-bound LLM calls."""
    TOOLS = "tools"
    """Server tools."""


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


def task_name(step: StepName) -> str:
    """The Celery task name of ``step``: ``aptix.step.<name>``."""
    return f"aptix.step.{step.value}"


TASK_QUEUES: dict[str, Queue] = {
    task_name(step): (
        Queue.LLM
        if step is StepName.LLM_CALL
        else Queue.TOOLS
        if step is StepName.EXECUTE_SERVER_TOOLS
        else Queue.PIPELINE
    )
    for step in StepName
}
"""Task name -> queue: the routing table both the gateway and the workers use."""
