"""Every Redis key Aptix uses, in one place."""

from __future__ import annotations

__all__ = [
    "ADMISSION_CURSOR_KEY",
    "ADMISSION_NUDGE_KEY",
    "ADMISSION_ORGS_KEY",
    "ADMISSION_ORG_PREFIX",
    "ADMISSION_RELEASING_KEY",
    "ADMISSION_SEQUENCE_KEY",
    "BROKER_EPOCH_SEEN_KEY",
    "BROKER_SENTINEL_KEY",
    "INFLIGHT_KEY",
    "RECONCILER_LEADER_KEY",
    "SCHEDULER_LEADER_KEY",
    "TIMERS_KEY",
    "cancel_key",
    "claim_key",
    "deliveries_key",
    "events_key",
    "held_key",
    "in_flight_key",
    "org_tokens_key",
    "request_window_key",
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

SCHEDULER_LEADER_KEY = f"{PREFIX}:scheduler:leader"
"""The lease of the one active admission scheduler (``workers.scheduler``)."""

ADMISSION_ORGS_KEY = f"{PREFIX}:admission:orgs"
"""Set: the organisations with turns held or in flight (``shared.state.admission``)."""

ADMISSION_CURSOR_KEY = f"{PREFIX}:admission:cursor"
"""The organisation the last release round served last: the next round starts after it."""

ADMISSION_SEQUENCE_KEY = f"{PREFIX}:admission:sequence"
"""Counter: the order in which held turns were accepted (their score in the held set)."""

ADMISSION_RELEASING_KEY = f"{PREFIX}:admission:releasing"
"""Hash: release id -> ``{"at": time, "turns": [...]}``, turns moved to in flight whose first
messages may not be sent yet; deleted once they are, re-sent by any scheduler when older than 5 s."""

ADMISSION_NUDGE_KEY = f"{PREFIX}:admission:nudge"
"""List of at most one item, pushed when turns are held or a turn in flight ends: wakes the scheduler."""

ADMISSION_ORG_PREFIX = f"{PREFIX}:admission:org:"
"""Prefix of an organisation's held and in-flight sets (:func:`held_key`, :func:`in_flight_key`)."""

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


def deliveries_key(turn_id: str, step_key: str) -> str:
    """Counter: the deliveries of one step of a turn since the step last ended in a worker that lived
    (its begin counts one; its save, or the release of its lease, deletes the counter)."""
    return f"{PREFIX}:turn:{turn_id}:deliveries:{step_key}"


def cancel_key(turn_id: str) -> str:
    """Set when a client cancelled the turn; every step checks it before it runs."""
    return f"{PREFIX}:turn:{turn_id}:cancelled"


def events_key(turn_id: str) -> str:
    """The turn's event log (a Redis Stream, ``shared.turn_events``): what clients watching the turn read."""
    return f"{PREFIX}:turn:{turn_id}:events"


def held_key(org_id: str) -> str:
    """Sorted set: an organisation's batch turns waiting for admission, turn id -> acceptance order."""
    return f"{ADMISSION_ORG_PREFIX}{org_id}:held"


def in_flight_key(org_id: str) -> str:
    """Sorted set: an organisation's turns admitted and not ended, turn id -> when (Unix time) admitted."""
    return f"{ADMISSION_ORG_PREFIX}{org_id}:inflight"


def request_window_key(org_id: str, window: int) -> str:
    """Counter: an organisation's requests in one minute (``window``: Unix minutes), every gateway together."""
    return f"{PREFIX}:org:{org_id}:requests:{window}"


def org_tokens_key(org_id: str, day: str) -> str:
    """Hash: the tokens of an organisation's turns created on one UTC day (``YYYY-MM-DD``): a field per turn
    (``t:<turn id>``, its tokens as last committed), their sum (``total``) and ``seeded`` once the turns the
    database had are in (``shared.state.token_usage``)."""
    return f"{PREFIX}:org:{org_id}:tokens:{day}"
