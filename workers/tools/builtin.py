"""The built-in server tools: ``get_current_time`` and ``agent_change_mode`` (TUL-007)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shared.modes import CHANGE_MODE_TOOL

__all__ = ["CHANGE_MODE_PARAMETERS", "CHANGE_MODE_TOOL", "get_current_time"]

CHANGE_MODE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "targetMode": {"type": "string", "description": "The mode to switch to; one of the catalog's modes."},
        "reason": {"type": "string", "description": "Why the conversation should change mode."},
        "branch": {"type": "boolean", "description": "Whether the change should start a new session branch."},
    },
    "required": ["targetMode"],
    "additionalProperties": False,
}
CHANGE_MODE_DESCRIPTION = (
    "Change the agent's mode when the user clearly moves to another domain. The backend validates "
    "the target mode; only claim the change if the result says it succeeded."
)


def get_current_time() -> str:
    """The current UTC time in ISO 8601."""
    return datetime.now(UTC).isoformat()
