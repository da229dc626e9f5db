"""Every Redis key Aptix uses, in one place."""

from __future__ import annotations

__all__ = ["cancel_key", "claim_key", "state_key", "version_key"]

PREFIX = "aptix"


def state_key(turn_id: str) -> str:
    """The TurnState document of a turn."""
    return f"{PREFIX}:turn:{turn_id}:state"


def version_key(turn_id: str) -> str:
    """The version of the turn's saved state, compared by every save."""
    return f"{PREFIX}:turn:{turn_id}:version"


def claim_key(turn_id: str, step_key: str) -> str:
    """The lease a worker holds while it runs one step of a turn."""
    return f"{PREFIX}:turn:{turn_id}:claim:{step_key}"


def cancel_key(turn_id: str) -> str:
    """Set when a client cancelled the turn; every step checks it before it runs."""
    return f"{PREFIX}:turn:{turn_id}:cancelled"
