"""RedisStateStore: every port of ``shared.state.store`` on one Redis, TurnState as one JSON value per
turn, saved with optimistic concurrency (Lua CAS).

Besides the documents it keeps the step leases and delivery counts, the cancel flags, the in-flight
markers the reconciler reads (``INFLIGHT_KEY``) and the parked timers of long waits (``TIMERS_KEY``).
A step costs two round trips of state work: ``begin`` (cancel check, lease, delivery count, load) and
``save`` (write, events, marker, lease and delivery count back and, when the turn's chain ended and
the caller says so, its admission slot); one more per renewal period renews every lease a worker
process holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import redis

from shared.errors import StateConflict
from shared.redis_clients import redis_client
from shared.state.keys import (
    ADMISSION_NUDGE_KEY,
    INFLIGHT_KEY,
    TIMERS_KEY,
    cancel_key,
    claim_key,
    deliveries_key,
    events_key,
    in_flight_key,
    state_key,
    version_key,
)
from shared.state.store import DELIVERIES_SECONDS, Lease, Release, StepStart, take_unsent_events
from shared.state.turn_state import TurnState

__all__ = ["RedisStateStore", "connect"]

_PIPELINE_CHUNK = 1000
"""Commands per pipeline of a bulk write (``cancel_many``)."""

# One round trip each, atomically. ``begin`` takes a step's lease unless the turn was cancelled,
# counts the delivery (the hash KEYS[5]: ``n`` deliveries, ``held`` the last held back, kept ARGV[6]
# seconds) and returns the count and the state with it (with no state yet, it sets the turn's in-flight
# marker); a save deletes the delivery count of the step whose lease it gives back, and a release does
# what its ``Release`` (ARGV[2]) says; a save is
# refused unless the stored version is the one the caller loaded, moves (or removes) the turn's
# in-flight marker, gives the step's lease back and, when told to (ARGV[10] == '1'), takes the turn
# out of its organisation's admission in-flight set and wakes the admission scheduler when it was
# there (``AdmissionQueue.finished``'s work, ``shared.state.admission``); a lease is renewed or
# released only by its holder, and a renewal pushes the marker forward (never back). A save appends
# the events it carries (name, data pairs after ARGV[10]) to the turn's event log, with the state's
# TTL and round.
_BEGIN = """
if ARGV[3] == '1' and redis.call('exists', KEYS[2]) == 1 then return {0} end
if not redis.call('set', KEYS[3], ARGV[1], 'NX', 'EX', ARGV[2]) then return {2} end
local deliveries = redis.call('hincrby', KEYS[5], 'n', 1)
local held = redis.call('hget', KEYS[5], 'held') or '0'
redis.call('expire', KEYS[5], ARGV[6])
local state = redis.call('get', KEYS[1])
if state then return {1, deliveries, held, state} end
if ARGV[4] ~= '' then redis.call('zadd', KEYS[4], ARGV[4], ARGV[5]) end
return {1, deliveries, held}
"""
_SAVE = """
if (redis.call('get', KEYS[2]) or '0') ~= ARGV[1] then return 0 end
redis.call('set', KEYS[1], ARGV[2], 'EX', ARGV[4])
redis.call('set', KEYS[2], ARGV[3], 'EX', ARGV[4])
if ARGV[5] == '' then
  redis.call('zrem', KEYS[3], ARGV[6])
else
  redis.call('zadd', KEYS[3], ARGV[5], ARGV[6])
end
if ARGV[10] == '1' and redis.call('zrem', KEYS[5], ARGV[6]) == 1 then
  redis.call('lpush', KEYS[6], '1')
  redis.call('ltrim', KEYS[6], 0, 0)
end
if KEYS[7] and redis.call('get', KEYS[7]) == ARGV[7] then redis.call('del', KEYS[7]) end
if KEYS[8] then redis.call('del', KEYS[8]) end
if #ARGV > 10 then
  for i = 11, #ARGV, 2 do
    redis.call('xadd', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', 'event', ARGV[i], 'data', ARGV[i + 1], 'round', ARGV[9])
  end
  redis.call('expire', KEYS[4], ARGV[4])
end
return 1
"""
_RENEW = """
local lost = {}
for i = 2, #KEYS do
  if redis.call('get', KEYS[i]) == ARGV[2 * i - 1] then
    redis.call('expire', KEYS[i], ARGV[1])
    redis.call('zadd', KEYS[1], 'GT', ARGV[2], ARGV[2 * i])
  else
    lost[#lost + 1] = i - 1
  end
end
return lost
"""
_RELEASE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == 'ended' then
  redis.call('del', KEYS[2])
elseif ARGV[2] == 'held_back' then
  local n = redis.call('hget', KEYS[2], 'n')
  if n then
    redis.call('hset', KEYS[2], 'held', n)
    redis.call('hincrby', KEYS[2], 'n', -1)
  end
end
return redis.call('del', KEYS[1])
"""
_POP_DUE = """
local due = redis.call('zrangebyscore', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #due > 0 then redis.call('zrem', KEYS[1], unpack(due)) end
return due
"""


class RedisStateStore:
    """The production state store: :class:`~shared.state.store.TurnStates`, ``StepLeases``,
    ``CancelFlags``, ``InFlightMarkers`` and ``Timers`` on one Redis."""

    def __init__(self, client: redis.Redis, *, max_events: int = 10000) -> None:
        """A store on ``client``; a turn's event log keeps about ``max_events`` events (APTIX_EVENTS_MAX_PER_TURN)."""
        self.client = client
        self.max_events = max_events
        self._begin = client.register_script(_BEGIN)
        self._save = client.register_script(_SAVE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._pop_due = client.register_script(_POP_DUE)

    @classmethod
    def from_url(
        cls, url: str, *, max_connections: int = 100, max_events: int = 10000, sentinel_password: str | None = None
    ) -> RedisStateStore:
        """A store on a new connection pool to ``url`` (:func:`connect`, with ``max_connections`` and
        ``sentinel_password``); a turn's event log keeps about ``max_events`` events (``APTIX_EVENTS_MAX_PER_TURN``)."""
        return cls(
            connect(url, max_connections=max_connections, sentinel_password=sentinel_password), max_events=max_events
        )

    def load(self, turn_id: str) -> TurnState | None:
        raw = self.client.get(state_key(turn_id))
        return None if raw is None else TurnState.model_validate_json(raw)

    def begin(
        self, lease: Lease, *, ttl_seconds: int, check_cancel: bool = True, alive_until: float | None = None
    ) -> StepStart:
        keys = [
            state_key(lease.turn_id), cancel_key(lease.turn_id), claim_key(lease.turn_id, lease.step_key), INFLIGHT_KEY,
            deliveries_key(lease.turn_id, lease.step_key),
        ]  # fmt: skip
        marker = "" if alive_until is None else repr(alive_until)
        args: list[str | int] = [
            lease.owner, ttl_seconds, "1" if check_cancel else "0", marker, lease.turn_id, DELIVERIES_SECONDS
        ]  # fmt: skip
        found = self._begin(keys=keys, args=args)
        if found[0] != 1:
            return StepStart(cancelled=found[0] == 0, claimed=False)
        state = TurnState.model_validate_json(found[3]) if len(found) > 3 else None
        return StepStart(
            cancelled=False, claimed=True, state=state, deliveries=int(found[1]), held_back_at=int(found[2])
        )

    def save(
        self,
        state: TurnState,
        *,
        ttl_seconds: int,
        alive_until: float | None = None,
        release: Lease | None = None,
        leave_admission: bool = False,
    ) -> None:
        expected = state.version
        state.version = expected + 1
        events, undo = take_unsent_events(state)
        keys = [
            state_key(state.turn_id), version_key(state.turn_id), INFLIGHT_KEY, events_key(state.turn_id),
            in_flight_key(state.org_id), ADMISSION_NUDGE_KEY,
        ]  # fmt: skip
        args: list[str | int] = [
            str(expected), state.model_dump_json(), str(state.version), ttl_seconds,
            "" if alive_until is None else repr(alive_until), state.turn_id,
            "" if release is None else release.owner, self.max_events, state.round, "1" if leave_admission else "0",
        ]  # fmt: skip
        if release is not None:
            keys += [claim_key(release.turn_id, release.step_key), deliveries_key(release.turn_id, release.step_key)]
        for name, data in events:
            args += [name, data]
        if not self._save(keys=keys, args=args):
            state.version = expected
            undo()
            raise StateConflict(f"turn {state.turn_id!r} was saved by someone else since version {expected}")

    def drop(self, turn_id: str) -> None:
        self.client.delete(state_key(turn_id), version_key(turn_id))

    def claim(self, lease: Lease, *, ttl_seconds: int) -> bool:
        return bool(self.client.set(claim_key(lease.turn_id, lease.step_key), lease.owner, nx=True, ex=ttl_seconds))

    def renew(self, leases: Sequence[Lease], *, ttl_seconds: int, alive_until: float) -> list[Lease]:
        if not leases:
            return []
        keys = [INFLIGHT_KEY, *(claim_key(lease.turn_id, lease.step_key) for lease in leases)]
        args: list[str | int] = [ttl_seconds, repr(alive_until)]
        for lease in leases:
            args += [lease.owner, lease.turn_id]
        return [leases[index - 1] for index in self._renew(keys=keys, args=args)]

    def release(self, lease: Lease, *, why: Release = Release.ENDED) -> None:
        keys = [claim_key(lease.turn_id, lease.step_key), deliveries_key(lease.turn_id, lease.step_key)]
        self._release(keys=keys, args=[lease.owner, why.value])

    def cancel_many(self, turn_ids: Sequence[str], *, ttl_seconds: int) -> None:
        for start in range(0, len(turn_ids), _PIPELINE_CHUNK):
            chunk = turn_ids[start : start + _PIPELINE_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for turn_id in chunk:
                pipe.set(cancel_key(turn_id), b"1", ex=ttl_seconds)
            pipe.zrem(INFLIGHT_KEY, *chunk)
            pipe.execute()

    def is_cancelled(self, turn_id: str) -> bool:
        return bool(self.client.exists(cancel_key(turn_id)))

    def mark_alive(self, turn_ids: Iterable[str], *, until: float) -> None:
        members = dict.fromkeys(turn_ids, until)
        if members:
            self.client.zadd(INFLIGHT_KEY, members)

    def alive_until(self, turn_ids: list[str]) -> dict[str, float]:
        if not turn_ids:
            return {}
        scores = self.client.zmscore(INFLIGHT_KEY, turn_ids)
        return {turn_id: float(score) for turn_id, score in zip(turn_ids, scores, strict=True) if score is not None}

    def forget(self, turn_id: str) -> None:
        self.client.zrem(INFLIGHT_KEY, turn_id)

    def forget_all(self) -> None:
        self.client.delete(INFLIGHT_KEY)

    def prune_markers(self, *, before: float) -> int:
        return int(self.client.zremrangebyscore(INFLIGHT_KEY, "-inf", before))

    def park(self, envelope_json: str, *, due: float) -> None:
        self.client.zadd(TIMERS_KEY, {envelope_json: due})

    def pop_due(self, *, now: float, limit: int = 500) -> list[str]:
        due = self._pop_due(keys=[TIMERS_KEY], args=[repr(now), limit])
        return [item.decode() if isinstance(item, bytes) else str(item) for item in due]


def connect(url: str, *, max_connections: int = 100, sentinel_password: str | None = None) -> redis.Redis:
    """A client on a new connection pool to the state store's Redis at ``url``.

    Args:
        url: the Redis URL: a server's, or a Sentinel-managed primary's (``shared.redis_clients``).
        max_connections: the most connections the pool opens (``APTIX_REDIS_MAX_CONNECTIONS``).
            Past it a command waits up to 10 s for a free one, then raises ``redis.ConnectionError``
            (a step's "later"): an unbounded pool would open one connection per greenlet of a
            2,000-slot ``llm`` worker.
        sentinel_password: the sentinels' password (``APTIX_REDIS_SENTINEL_PASSWORD``), for a ``sentinel://`` URL.
    """
    return redis_client(
        url,
        sentinel_password=sentinel_password,
        max_connections=max_connections,
        wait_seconds=10,
        health_check_interval=30,
        socket_timeout=10,
        socket_connect_timeout=5,
    )
