"""ToolRegistry: every server tool by name, with its schema and handler, built from the catalog.

Operator tools are imported from the catalog's ``handler`` paths when the registry is built, so a
catalog that names a handler that does not import is refused at worker start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from shared.errors import ConfigurationError
from shared.modes import CHANGE_MODE_TOOL, Mode, ModeCatalog
from workers.tools.builtin import CHANGE_MODE_DESCRIPTION, CHANGE_MODE_PARAMETERS, get_current_time

__all__ = ["ServerTool", "ToolRegistry"]


@dataclass(frozen=True, slots=True)
class ServerTool:
    """One server tool."""

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Callable[..., Any] | None
    """None for ``agent_change_mode``, which the mode-change logic runs itself."""
    timeout_seconds: float = 30.0
    idempotent: bool = False
    """Whether a call whose worker died after it started may simply run again."""
    validator: Any = field(init=False, repr=False, compare=False)
    """Checks a call's arguments against ``parameters`` (built once: building it checks the schema)."""

    def __post_init__(self) -> None:
        validator_class = jsonschema.validators.validator_for(self.parameters)
        validator_class.check_schema(self.parameters)
        object.__setattr__(self, "validator", validator_class(self.parameters))

    def schema(self) -> dict[str, Any]:
        """The Responses API function-tool definition (always with ``strict`` and ``parameters``)."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": False,
        }


class ToolRegistry:
    """Server tools by name."""

    def __init__(self, tools: list[ServerTool]) -> None:
        self._tools = {tool.name: tool for tool in tools}

    @classmethod
    def from_catalog(cls, catalog: ModeCatalog) -> ToolRegistry:
        """The built-ins plus the catalog's operator tools.

        Raises:
            ConfigurationError: when an operator tool's handler cannot be imported.
        """
        tools = [
            # Both built-ins are idempotent: a mode change is recorded once per (turn, change), and
            # reading the clock again is harmless.
            ServerTool(CHANGE_MODE_TOOL, CHANGE_MODE_DESCRIPTION, CHANGE_MODE_PARAMETERS, None, idempotent=True),
            ServerTool(
                "get_current_time",
                "The current UTC time in ISO 8601.",
                {"type": "object", "properties": {}, "additionalProperties": False},
                get_current_time,
                idempotent=True,
            ),
        ]
        for tool in catalog.tools:
            tools.append(
                ServerTool(
                    tool.name,
                    tool.description,
                    tool.parameters,
                    _import(tool.handler),
                    tool.timeout_seconds,
                    idempotent=tool.idempotent,
                )
            )
        return cls(tools)

    def get(self, name: str) -> ServerTool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def for_mode(self, mode: Mode) -> list[ServerTool]:
        """The server tools offered in ``mode`` (``agent_change_mode`` always included)."""
        return [self._tools[name] for name in mode.server_tool_names if name in self._tools]

    @property
    def names(self) -> frozenset[str]:
        """Every server tool name."""
        return frozenset(self._tools)


def _import(path: str) -> Callable[..., Any]:
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"tool handler {path!r} cannot be imported: {exc}") from exc
    if not callable(target):
        raise ConfigurationError(f"tool handler {path!r} is not callable")
    return target  # type: ignore[no-any-return]  # checked callable above
