"""Every Redis key Aptix uses, in one place, each named so that it lands where Redis Cluster needs it.

Redis Cluster hashes a key to one of 16,384 slots by its *hash tag*, the part between the first
``{`` and the next ``}``, and runs a Lua script or a transaction only when every key it touches is
in one slot. So every key of a turn carries the turn id as its tag (``aptix:turn:{<turn id>}:…``),
every key of an organisation's admission books the organisation id (``aptix:admission:org:{<org>}:…``)
and every key of a model's limiter and breaker the model's digest (``aptix:llm:{<digest>}:…``): each
script, and each atomic write, touches the keys of one turn, one organisation or one model. On a
single Redis the tags change nothing but the names.

The keys every turn touches are named here with what carries them (``docs/scaling.md``): the turn's
own keys (spread over the cluster by turn id), its organisation's in-flight set (one slot per
organisation), :data:`ADMISSION_NUDGE_KEY` at its end, :data:`ADMISSION_ORGS_KEY` when it is
admitted without being held; the parked timers are sharded (:func:`timers_key`).

Keys were renamed from the untagged names of earlier releases (``aptix:turn:<id>:state``,
``aptix:inflight``, …): a Redis holding old names is read as one that restarted empty, which the
checkpoints and the reconciler recover (``docs/operations.md``), and :data:`LEGACY_KEYS` are the
old keys without expiry that :func:`shared.state.legacy.retire_legacy_keys` removes.
"""

from __future__ import annotations

import zlib

__all__ = [
    "ADMISSION_CURSOR_KEY",
    "ADMISSION_DELAYS_KEY",
    "ADMISSION_NUDGE_KEY",
    "ADMISSION_ORGS_KEY",
    "BROKER_EPOCH_SEEN_KEY",
    "BROKER_SENTINEL_KEY",
    "LEGACY_KEYS",
    "LEGACY_TIMERS_KEY",
    "MARKER_KEPT_SECONDS",
    "PREFIX",
    "RECONCILER_LEADER_KEY",
    "SCHEDULER_LEADER_KEY",
    "TIMER_SHARDS",
    "alive_key",
    "cancel_key",
    "claim_key",
    "deliveries_key",
    "events_key",
    "held_key",
    "in_flight_key",
    "model_key",
    "org_releasing_key",
    "org_sequence_key",
    "org_tokens_key",
    "request_window_key",
    "state_key",
    "tag",
    "timer_shard",
    "timers_key",
    "timers_keys",
    "version_key",
]

PREFIX = "aptix"

TIMER_SHARDS = 16
"""Sub-keys of the parked timers (:func:`timers_key`): each its own hash tag, so a cluster spreads them.
Fixed: every process must agree on it, and a change would strand what the other shards hold."""

MARKER_KEPT_SECONDS = 86400
"""How long a turn's in-flight marker (:func:`alive_key`) outlives the time it vouches for: it expires
by itself then (what the reconciler's prune of lapsed markers did for the old shared sorted set)."""

RECONCILER_LEADER_KEY = f"{PREFIX}:reconciler:leader"
"""The lease of the one active reconciler."""

SCHEDULER_LEADER_KEY = f"{PREFIX}:scheduler:leader"
"""The lease of the one active admission scheduler (``workers.scheduler``)."""

ADMISSION_ORGS_KEY = f"{PREFIX}:admission:active-orgs"
"""Sorted set: the organisations with turns held or in flight -> when (Unix time) turns of theirs were
last held or admitted. The scheduler drops an organisation that has nothing held, in flight or being
released, and was not touched for a while (``shared.state.admission``). One key for every
organisation: touched once per held batch and once per interactive turn."""

ADMISSION_CURSOR_KEY = f"{PREFIX}:admission:cursor"
"""The organisation the last release round served last: the next round starts after it."""

ADMISSION_NUDGE_KEY = f"{PREFIX}:admission:nudge"
"""List of at most one item, pushed when turns are held or a turn in flight ends: wakes the scheduler.
The one key every turn touches at its end (LPUSH + LTRIM): a single list, since the scheduler blocks
on it (BLPOP waits on one slot), and two cheap commands per turn."""

ADMISSION_DELAYS_KEY = f"{PREFIX}:admission:delays"
"""Hash: worker process -> its last report of how long step messages waited between their sending and their
task's start (``workers.dispatch_delays``), which sizes the admission window (``workers.admission_window``)."""

BROKER_SENTINEL_KEY = f"{PREFIX}:broker:sentinel"
"""Kept in the broker's Redis database: when it vanishes, the broker lost its messages."""

BROKER_EPOCH_SEEN_KEY = f"{PREFIX}:broker:sentinel-seen"
"""Kept in the state store: a sentinel was set before, so a missing one means data loss."""

LEGACY_TIMERS_KEY = f"{PREFIX}:timers"
"""The parked timers' single sorted set of earlier releases (moved into the shards on upgrade)."""

LEGACY_KEYS = (
    f"{PREFIX}:inflight",
    f"{PREFIX}:admission:orgs",
    f"{PREFIX}:admission:releasing",
    f"{PREFIX}:admission:sequence",
)
"""Keys of earlier releases without an expiry that nothing reads any more (``retire_legacy_keys``)."""


def tag(value: str) -> str:
    """``value`` as a hash tag: the part of a key Redis Cluster hashes."""
    return "{" + value + "}"


def state_key(turn_id: str) -> str:
    """The TurnState document of a turn."""
    return f"{PREFIX}:turn:{tag(turn_id)}:state"


def version_key(turn_id: str) -> str:
    """The version of the turn's saved state, compared by every save."""
    return f"{PREFIX}:turn:{tag(turn_id)}:version"


def claim_key(turn_id: str, step_key: str) -> str:
    """The lease a worker holds while it runs one step of a turn."""
    return f"{PREFIX}:turn:{tag(turn_id)}:claim:{step_key}"


def deliveries_key(turn_id: str, step_key: str) -> str:
    """Counter: the deliveries of one step of a turn since the step last ended in a worker that lived
    (its begin counts one; its save, or the release of its lease, deletes the counter)."""
    return f"{PREFIX}:turn:{tag(turn_id)}:deliveries:{step_key}"


def cancel_key(turn_id: str) -> str:
    """Set when a client cancelled the turn; every step checks it before it runs."""
    return f"{PREFIX}:turn:{tag(turn_id)}:cancelled"


def events_key(turn_id: str) -> str:
    """The turn's event log (a Redis Stream, ``shared.turn_events``): what clients watching the turn read."""
    return f"{PREFIX}:turn:{tag(turn_id)}:events"


def alive_key(turn_id: str) -> str:
    """The turn's in-flight marker: until when (Unix time, as text) the turn counts as moving. Every state
    save and lease renewal pushes it forward; the reconciler re-drives unfinished turns without a live
    one. It expires :data:`MARKER_KEPT_SECONDS` after that time."""
    return f"{PREFIX}:turn:{tag(turn_id)}:alive"


def held_key(org_id: str) -> str:
    """Sorted set: an organisation's batch turns waiting for admission, turn id -> acceptance order."""
    return f"{PREFIX}:admission:org:{tag(org_id)}:held"


def in_flight_key(org_id: str) -> str:
    """Sorted set: an organisation's turns admitted and not ended, turn id -> when (Unix time) admitted."""
    return f"{PREFIX}:admission:org:{tag(org_id)}:inflight"


def org_sequence_key(org_id: str) -> str:
    """Counter: the order in which the organisation's held turns were accepted (their score in the held set)."""
    return f"{PREFIX}:admission:org:{tag(org_id)}:sequence"


def org_releasing_key(org_id: str) -> str:
    """Hash: release id -> ``{"at": time, "turns": [...]}``, the organisation's turns a release moved to in
    flight whose first messages may not be sent yet; deleted once they are, re-sent by any scheduler
    when older than 5 s."""
    return f"{PREFIX}:admission:org:{tag(org_id)}:releasing"


def model_key(digest: str, kind: str) -> str:
    """A key of one model's shared limiter or breaker (``kind``: ``limit``, ``pause``, ``breaker``), tagged
    with the model's digest so that the limiter's script touches one slot."""
    return f"{PREFIX}:llm:{tag(digest)}:{kind}"


def timers_key(shard: int) -> str:
    """Sorted set: parked envelope JSON -> when (Unix time) to send it; one of :data:`TIMER_SHARDS`. Long waits
    are parked here instead of in the broker, where a countdown longer than the visibility timeout is
    delivered twice."""
    return f"{PREFIX}:timers:{tag(str(shard))}"


def timers_keys() -> list[str]:
    """Every shard of the parked timers."""
    return [timers_key(shard) for shard in range(TIMER_SHARDS)]


def timer_shard(envelope_json: str) -> str:
    """The shard that parks ``envelope_json`` (by CRC-32: the same in every process)."""
    return timers_key(zlib.crc32(envelope_json.encode()) % TIMER_SHARDS)


def request_window_key(org_id: str, window: int) -> str:
    """Counter: an organisation's requests in one minute (``window``: Unix minutes), every gateway together."""
    return f"{PREFIX}:org:{tag(org_id)}:requests:{window}"


def org_tokens_key(org_id: str, day: str) -> str:
    """Hash: the tokens of an organisation's turns created on one UTC day (``YYYY-MM-DD``): a field per turn
    (``t:<turn id>``, its tokens as last committed), their sum (``total``) and ``seeded`` once the turns the
    database had are in (``shared.state.token_usage``)."""
    return f"{PREFIX}:org:{tag(org_id)}:tokens:{day}"
