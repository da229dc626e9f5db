"""Every Redis key Aptix uses, in one place."""

from __future__ import annotations

__all__ = [
    "BROKER_EPOCH_SEEN_KEY",
    "BROKER_SENTINEL_KEY",
    "INFLIGHT_KEY",
    "RECONCILER_LEADER_KEY",
    "TIMERS_KEY",
    "cancel_key",
    "claim_key",
    "events_key",
    "state_key",
    "version_key",
]

PREFIX = "aptix"

INFLIGHT_KEY = f"{PREFIX}:inflight"
"""Sorted set: turn id -> until when (Unix time) the turn counts as moving. Every state save and
lease renewal pushes it forward; the reconciler re-drives unfinished turns that are not in it."""

TIMERS_KEY = f"{PREFIX}:timers"
"""Sorted set: envelope JSON -> when (Unix time) to send it. Long waits are parked here instead of
in the broker, where a countdown longer than the visibility timeout is delivered twice."""

RECONCILER_LEADER_KEY = f"{PREFIX}:reconciler:leader"
"""The lease of the one active reconciler."""

BROKER_SENTINEL_KEY = f"{PREFIX}:broker:sentinel"
"""Kept in the broker's Redis database: when it vanishes, the broker lost its messages."""

BROKER_EPOCH_SEEN_KEY = f"{PREFIX}:broker:sentinel-seen"
"""Kept in the state store: a sentinel was set before, so a missing one means data loss."""


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


def events_key(turn_id: str) -> str:
    """The turn's event log (a Redis Stream, ``shared.turn_events``): what clients watching the turn read."""
    return f"{PREFIX}:turn:{turn_id}:events"
