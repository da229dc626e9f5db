"""RedisStateStore: every port of ``shared.state.store`` on one Redis or a Redis Cluster, TurnState as one
JSON value per turn, saved with optimistic concurrency (Lua CAS).

Besides the documents it keeps the step leases and delivery counts, the cancel flags, the in-flight
markers the reconciler reads (one key per turn, ``alive_key``) and the parked timers of long waits
(``TIMER_SHARDS`` sorted sets). Every script touches the keys of one turn (their hash tag: one
cluster slot). A step costs two round trips of state work: ``begin`` (cancel check, lease, delivery
count, load) and ``save`` (write, events, marker, lease and delivery count back, the next step's
message when the broker shares the server and, when the turn's chain ended and the caller says so,
its admission slot and its commit's tokens, pipelined with it); a step whose last
delivery was lost costs one more (``record_alone``); one more per renewal period renews every lease
a worker process holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

import redis

from shared.errors import StateConflict
from shared.redis_clients import redis_client
from shared.state.admission import Admitted, admit_calls, leave_calls
from shared.state.keys import (
    MARKER_KEPT_SECONDS,
    TIMER_SHARDS,
    alive_key,
    cancel_key,
    claim_key,
    deliveries_key,
    events_key,
    state_key,
    timer_shard,
    timers_keys,
    version_key,
)
from shared.state.scripts import Call, ScriptCall, pipelined
from shared.state.store import DELIVERIES_SECONDS, BrokerPush, Lease, Release, StepStart, take_unsent_events
from shared.state.token_usage import TurnTokens, merge_calls
from shared.state.turn_state import TurnState

__all__ = ["RedisStateStore", "connect"]

_PIPELINE_CHUNK = 1000
"""Commands per pipeline of a bulk write (``cancel_many``, ``mark_alive``) or read (``alive_until``)."""

# One round trip each, atomically, on the keys of one turn (one hash tag: one Redis Cluster slot).
# ``begin`` takes a step's lease unless the turn was cancelled, counts the delivery (the hash KEYS[5]:
# ``n`` deliveries, ``held`` the last held back, ``alone`` those run alone, kept ARGV[6] seconds) and
# returns the counts and the state with them (with no state yet, it sets the turn's in-flight marker
# KEYS[4], kept ARGV[7] seconds); ``record_alone`` counts a delivery run alone; a save deletes the
# delivery count of the step whose lease it gives back, and a release does what its ``Release``
# (ARGV[2]) says; a save is refused unless the stored version is the one the caller loaded, moves (or
# removes) the turn's in-flight marker and gives the step's lease back; a lease is renewed or released
# only by its holder, and a renewal pushes the marker forward (never back). A save appends the events it
# carries (name, data pairs after ARGV[15]) to the turn's event log, with the state's TTL and round, and
# last, when ARGV[11] names a broker list, pushes the turn's next step message ARGV[12] on it (in
# database ARGV[10] of the server, when that is not '') and acknowledges the message of delivery tag
# ARGV[13] (when not ''; with no list too: the save that ends the chain), deleting its entries in kombu's
# unacked hash ARGV[14] and index ARGV[15]: the message goes, and the one it follows is acknowledged, if
# and only if the state was written. The broker's
# keys are not declared keys: a push is only asked of a single Redis server (``shared.step_sender``),
# never of a cluster. What a turn's last save does for its organisation's admission books is
# ``shared.state.admission``'s script, in the same pipeline.
_BEGIN = """
if ARGV[3] == '1' and redis.call('exists', KEYS[2]) == 1 then return {0} end
if not redis.call('set', KEYS[3], ARGV[1], 'NX', 'EX', ARGV[2]) then return {2} end
local deliveries = redis.call('hincrby', KEYS[5], 'n', 1)
local seen = redis.call('hmget', KEYS[5], 'held', 'alone')
redis.call('expire', KEYS[5], ARGV[6])
local state = redis.call('get', KEYS[1])
if state then return {1, deliveries, seen[1] or '0', seen[2] or '0', state} end
if ARGV[4] ~= '' then redis.call('set', KEYS[4], ARGV[4], 'EX', ARGV[7]) end
return {1, deliveries, seen[1] or '0', seen[2] or '0'}
"""
_SAVE = """
if (redis.call('get', KEYS[2]) or '0') ~= ARGV[1] then return 0 end
redis.call('set', KEYS[1], ARGV[2], 'EX', ARGV[4])
redis.call('set', KEYS[2], ARGV[3], 'EX', ARGV[4])
if ARGV[5] == '' then
  redis.call('del', KEYS[3])
else
  redis.call('set', KEYS[3], ARGV[5], 'EX', ARGV[9])
end
if KEYS[5] and redis.call('get', KEYS[5]) == ARGV[6] then redis.call('del', KEYS[5]) end
if KEYS[6] then redis.call('del', KEYS[6]) end
if #ARGV > 15 then
  for i = 16, #ARGV, 2 do
    redis.call('xadd', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'event', ARGV[i], 'data', ARGV[i + 1], 'round', ARGV[8])
  end
  redis.call('expire', KEYS[4], ARGV[4])
end
if ARGV[11] ~= '' or ARGV[13] ~= '' then
  if ARGV[10] ~= '' then redis.call('select', ARGV[10]) end
  if ARGV[11] ~= '' then redis.call('lpush', ARGV[11], ARGV[12]) end
  if ARGV[13] ~= '' then
    redis.call('zrem', ARGV[15], ARGV[13])
    redis.call('hdel', ARGV[14], ARGV[13])
  end
end
return 1
"""
# KEYS[1] the turn's marker, then the claims of its leases; ARGV: TTL, marker, the marker's TTL, then owners.
_RENEW = """
local lost, renewed = {}, false
for i = 2, #KEYS do
  if redis.call('get', KEYS[i]) == ARGV[i + 2] then
    redis.call('expire', KEYS[i], ARGV[1])
    renewed = true
  else
    lost[#lost + 1] = i - 1
  end
end
if renewed and tonumber(ARGV[2]) > (tonumber(redis.call('get', KEYS[1])) or 0) then
  redis.call('set', KEYS[1], ARGV[2], 'EX', ARGV[3])
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
_RECORD_ALONE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('hincrby', KEYS[2], 'alone', 1)
return 1
"""
# ARGV: the broker's database on this server ('' for this one), then list and message pairs: the messages of turns
# whose markers the same pipeline sets (``mark_alive``), pushed as kombu would (its keys are not declared keys: a
# push is only asked of a single Redis server, as the save's).
_PUSH = """
if ARGV[1] ~= '' then redis.call('select', ARGV[1]) end
for i = 2, #ARGV, 2 do redis.call('lpush', ARGV[i], ARGV[i + 1]) end
return 1
"""
_POP_DUE = """
local due = redis.call('zrangebyscore', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #due > 0 then redis.call('zrem', KEYS[1], unpack(due)) end
return due
"""
_MARKER_PATTERN = "aptix:turn:*:alive"
"""Every turn's in-flight marker (``alive_key``): what ``forget_all`` scans for."""


def _marker_ttl(until: float) -> int:
    """The TTL (seconds) of a marker vouching until ``until``: what is left of it, plus the time it is kept."""
    return max(0, math.ceil(until - time.time())) + MARKER_KEPT_SECONDS


def _push_args(push: BrokerPush | None) -> list[str | int]:
    """ARGV[10] to ARGV[15] of the save script: the broker's database, list and message, and the tag and
    unacked keys of the message acknowledged ('' for each that is not given)."""
    if push is None:
        return [""] * 6
    db = "" if push.db is None else push.db
    return [db, push.key or "", push.payload, push.ack or "", push.unacked_key, push.unacked_index_key]


class RedisStateStore:
    """The production state store: :class:`~shared.state.store.TurnStates`, ``StepLeases``,
    ``CancelFlags``, ``InFlightMarkers`` and ``Timers`` on one Redis or a Redis Cluster."""

    def __init__(self, client: redis.Redis, *, max_events: int = 10000) -> None:
        """A store on ``client``; a turn's event log keeps about ``max_events`` events (APTIX_EVENTS_MAX_PER_TURN)."""
        self.client = client
        self.max_events = max_events
        self._begin = client.register_script(_BEGIN)
        self._save = client.register_script(_SAVE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._record_alone = client.register_script(_RECORD_ALONE)
        self._pop_due = client.register_script(_POP_DUE)
        self._push = client.register_script(_PUSH)
        self._leave = leave_calls(client)
        self._merge_tokens = merge_calls(client)

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
        turn_id = lease.turn_id
        keys = [
            state_key(turn_id), cancel_key(turn_id), claim_key(turn_id, lease.step_key), alive_key(turn_id),
            deliveries_key(turn_id, lease.step_key),
        ]  # fmt: skip
        marker = "" if alive_until is None else repr(alive_until)
        expiry = 0 if alive_until is None else _marker_ttl(alive_until)
        args: list[str | int] = [
            lease.owner, ttl_seconds, "1" if check_cancel else "0", marker, turn_id, DELIVERIES_SECONDS, expiry
        ]  # fmt: skip
        found = self._begin(keys=keys, args=args)
        if found[0] != 1:
            return StepStart(cancelled=found[0] == 0, claimed=False)
        state = TurnState.model_validate_json(found[4]) if len(found) > 4 else None
        deliveries, held_back_at, lost_alone = (int(count) for count in found[1:4])
        return StepStart(
            cancelled=False,
            claimed=True,
            state=state,
            deliveries=deliveries,
            held_back_at=held_back_at,
            lost_alone=lost_alone,
        )

    def save(
        self,
        state: TurnState,
        *,
        ttl_seconds: int,
        alive_until: float | None = None,
        release: Lease | None = None,
        leave_admission: bool = False,
        push: BrokerPush | None = None,
        tokens: TurnTokens | None = None,
    ) -> None:
        """See :meth:`TurnStates.save`. The turn's keys are written by one script; with ``leave_admission``
        its organisation's in-flight set (another slot on a cluster) is written by the admission script,
        and with ``tokens`` its organisation's count of the day by the token merge, in the same pipeline,
        so one round trip still does it all on a single Redis. Those parts do not wait for the save's
        verdict: a refused last save (another copy of the same step saved first) still frees the slot, as
        that copy's save does, and merges what that copy's commit merges."""
        expected = state.version
        state.version = expected + 1
        events, undo = take_unsent_events(state)
        turn_id = state.turn_id
        keys = [state_key(turn_id), version_key(turn_id), alive_key(turn_id), events_key(turn_id)]
        args: list[str | int] = [
            str(expected), state.model_dump_json(), str(state.version), ttl_seconds,
            "" if alive_until is None else repr(alive_until), "" if release is None else release.owner,
            self.max_events, state.round, 0 if alive_until is None else _marker_ttl(alive_until), *_push_args(push),
        ]  # fmt: skip
        if release is not None:
            keys += [claim_key(release.turn_id, release.step_key), deliveries_key(release.turn_id, release.step_key)]
        for name, data in events:
            args += [name, data]
        calls: list[Call] = [ScriptCall(self._save, keys, args)]
        if leave_admission:
            calls += self._leave(state.org_id, [turn_id])
        if tokens is not None:
            calls += self._merge_tokens(tokens)
        replies = pipelined(self.client, calls) if len(calls) > 1 else [self._save(keys=keys, args=args)]
        if not replies[0]:
            state.version = expected
            undo()
            raise StateConflict(f"turn {turn_id!r} was saved by someone else since version {expected}")

    def drop(self, turn_id: str) -> None:
        self.client.delete(state_key(turn_id), version_key(turn_id))

    def claim(self, lease: Lease, *, ttl_seconds: int) -> bool:
        return bool(self.client.set(claim_key(lease.turn_id, lease.step_key), lease.owner, nx=True, ex=ttl_seconds))

    def renew(self, leases: Sequence[Lease], *, ttl_seconds: int, alive_until: float) -> list[Lease]:
        """See :meth:`StepLeases.renew`: one script per turn (its leases and its marker share a slot), all
        in one pipeline."""
        if not leases:
            return []
        by_turn: dict[str, list[Lease]] = {}
        for lease in leases:
            by_turn.setdefault(lease.turn_id, []).append(lease)
        calls: list[ScriptCall] = []
        for turn_id, ours in by_turn.items():
            keys = [alive_key(turn_id), *(claim_key(turn_id, lease.step_key) for lease in ours)]
            args: list[str | int] = [ttl_seconds, repr(alive_until), _marker_ttl(alive_until)]
            calls.append(ScriptCall(self._renew, keys, [*args, *(lease.owner for lease in ours)]))
        lost: list[Lease] = []
        for ours, indexes in zip(by_turn.values(), pipelined(self.client, calls), strict=True):
            lost += [ours[index - 1] for index in indexes]
        return lost

    def release(self, lease: Lease, *, why: Release = Release.ENDED) -> None:
        keys = [claim_key(lease.turn_id, lease.step_key), deliveries_key(lease.turn_id, lease.step_key)]
        self._release(keys=keys, args=[lease.owner, why.value])

    def record_alone(self, lease: Lease) -> bool:
        keys = [claim_key(lease.turn_id, lease.step_key), deliveries_key(lease.turn_id, lease.step_key)]
        return bool(self._record_alone(keys=keys, args=[lease.owner]))

    def cancel_many(self, turn_ids: Sequence[str], *, ttl_seconds: int) -> None:
        for start in range(0, len(turn_ids), _PIPELINE_CHUNK):
            pipe = self.client.pipeline(transaction=False)
            for turn_id in turn_ids[start : start + _PIPELINE_CHUNK]:
                pipe.set(cancel_key(turn_id), b"1", ex=ttl_seconds)
                pipe.delete(alive_key(turn_id))
            pipe.execute()

    def is_cancelled(self, turn_id: str) -> bool:
        return bool(self.client.exists(cancel_key(turn_id)))

    def mark_alive(
        self,
        turn_ids: Iterable[str],
        *,
        until: float,
        admitted: Admitted | None = None,
        pushes: Sequence[BrokerPush] = (),
    ) -> None:
        """See :meth:`InFlightMarkers.mark_alive`: a pipeline per thousand turns, the admission's counts and the
        pushes (one script) in the last."""
        ids = list(dict.fromkeys(turn_ids))
        marker, expiry = repr(until), _marker_ttl(until)
        for start in range(0, max(len(ids), 1), _PIPELINE_CHUNK):
            calls: list[Call] = [
                ("SET", alive_key(turn_id), marker, "EX", expiry) for turn_id in ids[start : start + _PIPELINE_CHUNK]
            ]
            if start + _PIPELINE_CHUNK >= len(ids):
                if admitted is not None:
                    calls += admit_calls(admitted, ids)
                calls += self._push_calls(pushes)
            if calls:
                pipelined(self.client, calls)

    def _push_calls(self, pushes: Sequence[BrokerPush]) -> list[Call]:
        """The script that puts ``pushes``' messages on their broker lists (none to push: no call)."""
        messages = [item for push in pushes if push.key is not None for item in (push.key, push.payload)]
        if not messages:
            return []
        if len({push.db for push in pushes}) > 1 or any(push.ack is not None for push in pushes):
            raise ValueError("pushes beside markers go to one broker database and acknowledge nothing")
        db = pushes[0].db
        return [ScriptCall(self._push, [], ["" if db is None else db, *messages])]

    def alive_until(self, turn_ids: list[str]) -> dict[str, float]:
        found: dict[str, float] = {}
        for start in range(0, len(turn_ids), _PIPELINE_CHUNK):
            chunk = turn_ids[start : start + _PIPELINE_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for turn_id in chunk:
                pipe.get(alive_key(turn_id))
            for turn_id, value in zip(chunk, pipe.execute(), strict=True):
                if value is not None:
                    found[turn_id] = float(value)
        return found

    def forget(self, turn_id: str) -> None:
        self.client.delete(alive_key(turn_id))

    def forget_all(self) -> None:
        """See :meth:`InFlightMarkers.forget_all`: scans every node for markers (rare: the broker lost its
        messages), deleting them a pipeline at a time."""
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=_MARKER_PATTERN, count=1000):
            batch.append(key)
            if len(batch) >= _PIPELINE_CHUNK:
                self._delete_each(batch)
                batch = []
        self._delete_each(batch)

    def prune_markers(self, *, before: float) -> int:
        """Nothing to do: each marker expires by itself, :data:`~shared.state.keys.MARKER_KEPT_SECONDS`
        after the time it vouches for. Returns 0."""
        return 0

    def park(self, envelope_json: str, *, due: float) -> None:
        self.client.zadd(timer_shard(envelope_json), {envelope_json: due})

    def pop_due(self, *, now: float, limit: int = 500) -> list[str]:
        """See :meth:`Timers.pop_due`: up to ``limit`` split evenly over the shards, in one pipeline."""
        per_shard = max(1, -(-limit // TIMER_SHARDS))
        calls = [ScriptCall(self._pop_due, [key], [repr(now), per_shard]) for key in timers_keys()]
        due: list[str] = []
        for items in pipelined(self.client, calls):
            due += [item.decode() if isinstance(item, bytes) else str(item) for item in items]
        return due

    def _delete_each(self, keys: list[bytes]) -> None:
        if keys:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.delete(key)
            pipe.execute()


def connect(url: str, *, max_connections: int = 100, sentinel_password: str | None = None) -> redis.Redis:
    """A client on a new connection pool to the state store's Redis at ``url``.

    Args:
        url: the Redis URL: a server's, a Sentinel-managed primary's, or a Redis Cluster's
            (``redis+cluster://``: a pool of ``max_connections`` to each node; ``shared.redis_clients``).
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
