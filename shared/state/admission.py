"""AdmissionQueue: the Redis side of fair admission (issue 14, item 2).

A batch's turns are not sent to the broker when they are accepted: the gateway *holds* them in their
organisation's held set (sorted by acceptance). The admission scheduler (``workers.scheduler``)
*releases* them round-robin across organisations, one turn per organisation per round, skipping an
organisation with nothing held or with its cap of turns in flight (``APTIX_ORG_MAX_IN_FLIGHT``, or its own:
``aptix orgs set --max-in-flight``). A turn is in
flight from its release (or, for an interactive turn or a re-entry, which are never held, from its
acceptance) until it ends or pauses: the worker driver's last state save removes it, in the same
round trip (``TurnStates.save(leave_admission=True)`` does what :meth:`AdmissionQueue.finished` does),
as does whoever ends it early (``shared.turn_ending``); the scheduler's sweep drops the entries of
turns that ended without saying so, so a lost removal costs capacity for seconds, not for ever.

Crash safety: one Lua script moves turns from held to in flight *and* writes a releasing note (the
turns and the time) in the same step; the scheduler deletes the note once it has sent their first
messages. A note older than :data:`REPUBLISH_AFTER_SECONDS` belongs to a scheduler that died in
between: any scheduler sends those messages again (a second first message is harmless: the driver's
step lease and ``steps_done`` skip a step that ran) and deletes it. Two schedulers releasing at once
never release a turn twice: the move is atomic.

The scripts build an organisation's key names from :data:`~shared.state.keys.ADMISSION_ORG_PREFIX`
(one Redis, no cluster: the same as every Aptix Lua script's Redis).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import redis

from shared.state.keys import (
    ADMISSION_CURSOR_KEY,
    ADMISSION_NUDGE_KEY,
    ADMISSION_ORG_PREFIX,
    ADMISSION_ORGS_KEY,
    ADMISSION_RELEASING_KEY,
    ADMISSION_SEQUENCE_KEY,
    held_key,
    in_flight_key,
)

__all__ = ["REPUBLISH_AFTER_SECONDS", "AdmissionQueue", "OrgCounts", "Place", "Release"]

REPUBLISH_AFTER_SECONDS = 5.0
"""A releasing note this old belongs to a scheduler that died between the move and the send."""

_CHUNK = 5000
"""Turn ids per script call (Lua's ``unpack`` has a limit of a few thousand values)."""

Place = Literal["held", "in_flight"]

_HOLD = """
local n = #ARGV - 1
local last = redis.call('incrby', KEYS[3], n)
local members = {}
for i = 2, #ARGV do
  members[#members + 1] = last - n + i - 1
  members[#members + 1] = ARGV[i]
end
for s = 1, #members, 1000 do
  redis.call('zadd', KEYS[1], 'NX', unpack(members, s, math.min(s + 999, #members)))
end
redis.call('sadd', KEYS[2], ARGV[1])
redis.call('lpush', KEYS[4], '1')
redis.call('ltrim', KEYS[4], 0, 0)
return n
"""
_RELEASE = """
local orgs = redis.call('smembers', KEYS[1])
if #orgs == 0 then return {} end
table.sort(orgs)
local cursor = redis.call('get', KEYS[2]) or ''
local start = 1
for i, org in ipairs(orgs) do
  if org > cursor then start = i break end
end
local order = {}
for i = start, #orgs do order[#order + 1] = orgs[i] end
for i = 1, start - 1 do order[#order + 1] = orgs[i] end
local cap, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local caps = {}
if ARGV[6] and ARGV[6] ~= '' then caps = cjson.decode(ARGV[6]) end
local open, released, last = {}, {}, nil
for i = 1, #order do open[i] = true end
local progress = true
while progress and #released < limit do
  progress = false
  for i, org in ipairs(order) do
    if open[i] and #released < limit then
      local flying = ARGV[1] .. org .. ':inflight'
      if redis.call('zcard', flying) >= (tonumber(caps[org]) or cap) then
        open[i] = false
      else
        local popped = redis.call('zpopmin', ARGV[1] .. org .. ':held')
        if #popped == 0 then
          open[i] = false
          if redis.call('zcard', flying) == 0 then redis.call('srem', KEYS[1], org) end
        else
          redis.call('zadd', flying, ARGV[4], popped[1])
          released[#released + 1] = popped[1]
          last = org
          progress = true
        end
      end
    end
  end
end
if last then redis.call('set', KEYS[2], last) end
if #released > 0 then
  redis.call('hset', KEYS[3], ARGV[5], cjson.encode({at = tonumber(ARGV[4]), turns = released}))
end
return released
"""
# ``finished`` and ``leave``: with a third key (the held set, ``leave``), the turns leave it too.
_FINISHED = """
local removed = 0
for i = 1, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  if KEYS[3] then redis.call('zrem', KEYS[3], unpack(ARGV, i, last)) end
  removed = removed + redis.call('zrem', KEYS[1], unpack(ARGV, i, last))
end
if removed > 0 then
  redis.call('lpush', KEYS[2], '1')
  redis.call('ltrim', KEYS[2], 0, 0)
end
return removed
"""


@dataclass(frozen=True, slots=True)
class Release:
    """Turns one release moved to in flight, under the id of their releasing note."""

    release_id: str
    turn_ids: list[str]


@dataclass(frozen=True, slots=True)
class OrgCounts:
    """An organisation's turns held and in flight."""

    held: int
    in_flight: int


class AdmissionQueue:
    """The held and in-flight sets of every organisation, on the state store's Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._hold = client.register_script(_HOLD)
        self._release = client.register_script(_RELEASE)
        self._finished = client.register_script(_FINISHED)

    def hold(self, org_id: str, turn_ids: list[str]) -> None:
        """Hold ``org_id``'s new batch turns (after those it holds already), all or none, and wake the scheduler.

        Raises:
            redis.RedisError: Redis refused (nothing was held).
        """
        if not turn_ids:
            return
        keys = [held_key(org_id), ADMISSION_ORGS_KEY, ADMISSION_SEQUENCE_KEY, ADMISSION_NUDGE_KEY]
        with self.client.pipeline(transaction=True) as pipe:
            for start in range(0, len(turn_ids), _CHUNK):
                self._hold(keys=keys, args=[org_id, *turn_ids[start : start + _CHUNK]], client=pipe)
            pipe.execute()

    def admit_now(self, org_id: str, turn_ids: list[str], *, now: float) -> None:
        """Count turns that are never held (interactive turns, re-entries) in flight from ``now``.

        Raises:
            redis.RedisError: Redis refused.
        """
        if not turn_ids:
            return
        with self.client.pipeline(transaction=True) as pipe:
            pipe.zadd(in_flight_key(org_id), dict.fromkeys(turn_ids, now))
            pipe.sadd(ADMISSION_ORGS_KEY, org_id)
            pipe.execute()

    def release(self, *, cap: int, limit: int, now: float, caps: Mapping[str, int] | None = None) -> Release | None:
        """Move up to ``limit`` held turns to in flight, round-robin across organisations, none past its cap:
        ``caps[org]`` for an organisation with a cap of its own (``aptix orgs set --max-in-flight``), else ``cap``.

        Writes the releasing note in the same atomic step; :meth:`settle` deletes it once the turns'
        first messages are sent. None when nothing could be released.
        """
        release_id = uuid.uuid4().hex
        keys = [ADMISSION_ORGS_KEY, ADMISSION_CURSOR_KEY, ADMISSION_RELEASING_KEY]
        own = json.dumps(dict(caps)) if caps else ""
        raw = self._release(keys=keys, args=[ADMISSION_ORG_PREFIX, cap, limit, repr(now), release_id, own])
        turn_ids = [_text(turn_id) for turn_id in raw]
        return Release(release_id, turn_ids) if turn_ids else None

    def settle(self, release_id: str) -> None:
        """Delete a releasing note: its turns' first messages are sent."""
        self.client.hdel(ADMISSION_RELEASING_KEY, release_id)

    def stale_releases(self, *, now: float, older_than: float = REPUBLISH_AFTER_SECONDS) -> list[Release]:
        """The releasing notes written before ``now - older_than`` (their scheduler died before sending)."""
        stale = []
        for release_id, note in self.client.hgetall(ADMISSION_RELEASING_KEY).items():
            parsed = json.loads(note)
            if float(parsed["at"]) <= now - older_than:
                turns = parsed["turns"] if isinstance(parsed["turns"], list) else []  # cjson: {} for an empty list
                stale.append(Release(_text(release_id), [str(turn_id) for turn_id in turns]))
        return stale

    def finished(self, org_id: str, turn_ids: Iterable[str]) -> int:
        """Turns of ``org_id`` that ended or paused: no longer in flight; wakes the scheduler if one was.

        Returns:
            How many were in flight.
        """
        ids = list(turn_ids)
        if not ids:
            return 0
        return int(self._finished(keys=[in_flight_key(org_id), ADMISSION_NUDGE_KEY], args=ids))

    def leave(self, org_id: str, turn_ids: Sequence[str]) -> int:
        """Turns of ``org_id`` that ended early leave admission, in one round trip: a held one is never
        sent, a released one frees its slot (and wakes the scheduler, as :meth:`finished` does).

        Returns:
            How many were in flight.
        """
        if not turn_ids:
            return 0
        keys = [in_flight_key(org_id), ADMISSION_NUDGE_KEY, held_key(org_id)]
        return int(self._finished(keys=keys, args=list(turn_ids)))

    def withdraw(self, org_id: str, turn_ids: list[str]) -> int:
        """Take held turns out of the queue (released turns are untouched); how many were held."""
        if not turn_ids:
            return 0
        return int(self.client.zrem(held_key(org_id), *turn_ids))

    def where(self, org_id: str, turn_ids: list[str]) -> dict[str, Place | None]:
        """Whether each turn is held, in flight, or neither (lost with Redis's data, or ended)."""
        if not turn_ids:
            return {}
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zmscore(held_key(org_id), turn_ids)
            pipe.zmscore(in_flight_key(org_id), turn_ids)
            held, flying = pipe.execute()
        places: dict[str, Place | None] = {}
        for turn_id, held_score, flying_score in zip(turn_ids, held, flying, strict=True):
            places[turn_id] = "held" if held_score is not None else "in_flight" if flying_score is not None else None
        return places

    def in_flight_since(self, org_id: str, *, before: float, limit: int = 2000) -> list[tuple[str, float]]:
        """``org_id``'s turns in flight since before ``before``, with since when (what the sweep checks)."""
        entries: list[tuple[bytes, float]] = self.client.zrangebyscore(
            in_flight_key(org_id), "-inf", repr(before), start=0, num=limit, withscores=True
        )  # type: ignore[assignment]  # redis-py's stubs do not know withscores
        return [(_text(turn_id), float(since)) for turn_id, since in entries]

    def counts(self) -> dict[str, OrgCounts]:
        """Every organisation with turns held or in flight, with how many of each."""
        orgs = sorted(_text(org) for org in self.client.smembers(ADMISSION_ORGS_KEY))
        if not orgs:
            return {}
        with self.client.pipeline(transaction=False) as pipe:
            for org in orgs:
                pipe.zcard(held_key(org))
                pipe.zcard(in_flight_key(org))
            sizes = pipe.execute()
        return {org: OrgCounts(int(sizes[2 * i]), int(sizes[2 * i + 1])) for i, org in enumerate(orgs)}

    def wait(self, timeout: float) -> bool:
        """Block until nudged (turns held, a turn in flight ended) or ``timeout`` seconds; whether nudged."""
        return self.client.blpop([ADMISSION_NUDGE_KEY], timeout=timeout) is not None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
