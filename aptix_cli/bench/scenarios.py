"""The bench's scenarios: what each turn asks the scripted model for (``scripted_llm.script`` directives).

- ``plain``: the model answers text (1 model call).
- ``server-tool``: the model calls ``get_current_time`` (a built-in server tool the default mode
  catalog offers), then answers with its result (2 model calls).
- ``client-tool``: the model calls a client tool the request declares; the turn pauses as
  ``requires_client_tools``, the bench posts the result, and the same turn resumes and answers
  (2 model calls, 2 rounds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["CLIENT_TOOL", "SCENARIOS", "Scenario"]

CLIENT_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "bench_lookup",
    "description": "Look a number up on the client.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
}
"""The client tool of the ``client-tool`` scenario."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """One kind of turn."""

    name: str
    description: str
    """E.g. ``1 model call``."""
    directive: str
    """What the user text asks the scripted model for ("" for a plain answer)."""
    client_tool: bool = False
    """Whether the turn waits for client tool results the bench posts."""

    def request(self, index: int) -> dict[str, Any]:
        """The TurnRequest of the scenario's ``index``-th turn (a new session each)."""
        text = f"bench turn {index}"
        request: dict[str, Any] = {"input": f"{text} {self.directive}".strip()}
        if self.client_tool:
            request["tools"] = [CLIENT_TOOL]
        return request


SCENARIOS: dict[str, Scenario] = {
    "plain": Scenario("plain", "1 model call", ""),
    "server-tool": Scenario(
        "server-tool", "1 server tool, 2 model calls", "[[call:get_current_time " + json.dumps({}) + "]]"
    ),
    "client-tool": Scenario(
        "client-tool",
        "1 client tool, 2 model calls, paused and resumed",
        "[[call:bench_lookup " + json.dumps({"n": 7}) + "]]",
        client_tool=True,
    ),
}
"""Every scenario by its ``--scenario`` name."""
