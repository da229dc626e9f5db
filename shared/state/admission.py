"""AdmissionQueue: the Redis side of fair admission (issue 14, item 2).

A batch's turns are not sent to the broker when they are accepted: the gateway *holds* them in their
organisation's held set (sorted by acceptance). The admission scheduler (``workers.scheduler``)
*releases* them round-robin across organisations, one turn per organisation per round, skipping an
organisation with nothing held or with its cap of turns in flight (``APTIX_ORG_MAX_IN_FLIGHT``, or its own:
``aptix orgs set --max-in-flight``). A turn is in
flight from its release (or, for an interactive turn or a re-entry, which are never held, from its
acceptance) until it ends or pauses: the worker driver's last state save removes it, in the same
round trip (``TurnStates.save(leave_admission=True)`` pipelines :func:`leave_calls`, what
:meth:`AdmissionQueue.finished` does), as does whoever ends it early (``shared.turn_ending``); the
scheduler's sweep drops the entries of turns that ended without saying so, so a lost removal costs
capacity for seconds, not for ever.

Redis Cluster: every script touches the keys of one organisation (their hash tag, ``held_key``), and
the keys shared by every organisation (:data:`~shared.state.keys.ADMISSION_ORGS_KEY`, the cursor,
the nudge) are written by plain commands in the same pipeline. So a release plans in Python and
moves turns with one script per organisation: two round trips per release (the organisations with the
counts of those the last release saw, the moves), once per scheduler wake-up, not per turn. The
organisations' set is a sorted set of when each was last touched: the scheduler drops an idle
organisation (nothing held, in flight or being released) only when it was not touched for
:data:`IDLE_ORG_SECONDS`, so a hold racing the drop (its two writes land on different nodes, in either
order) never leaves held turns unseen.

Crash safety: one Lua script moves an organisation's turns from held to in flight *and* writes a
releasing note (the turns and the time) in that organisation's releasing hash in the same step; the
scheduler deletes the notes once it has sent their first messages (in its next release's first round
trip, :meth:`AdmissionQueue.release`'s ``settled``). A note older than
:data:`REPUBLISH_AFTER_SECONDS` belongs to a scheduler that died in between: any scheduler sends those
messages again (a second first message is harmless: the driver's step lease and ``steps_done`` skip a
step that ran) and deletes it. Two schedulers releasing at once never release a turn twice: each move
is atomic, and re-checks the organisation's limit.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import redis

from shared.state.keys import (
    ADMISSION_CURSOR_KEY,
    ADMISSION_DELAYS_KEY,
    ADMISSION_NUDGE_KEY,
    ADMISSION_ORGS_KEY,
    held_key,
    in_flight_key,
    org_releasing_key,
    org_sequence_key,
)
from shared.state.scripts import Call, ScriptCall, pipelined

__all__ = [
    "DELAY_FRESH_SECONDS", "IDLE_ORG_SECONDS", "REPUBLISH_AFTER_SECONDS", "AdmissionQueue", "Admitted", "DelayReport",
    "OrgCounts", "Place", "Release", "admit_calls", "leave_calls",
]  # fmt: skip

REPUBLISH_AFTER_SECONDS = 5.0
"""A releasing note this old belongs to a scheduler that died between the move and the send."""

IDLE_ORG_SECONDS = 60.0
"""An organisation with nothing held or in flight leaves the organisations' set once untouched this long."""

DELAY_FRESH_SECONDS = 2.0
"""A worker's dispatch-delay report older than this says nothing about now (:meth:`AdmissionQueue.delays`)."""
_DELAY_FORGOTTEN_SECONDS = 60.0
"""A report this old is deleted: its process stopped (each process reports under a name of its own)."""

Place = Literal["held", "in_flight"]

# KEYS: the organisation's held set and sequence. ARGV: the turn ids.
_HOLD = """
local n = #ARGV
local last = redis.call('incrby', KEYS[2], n)
local members = {}
for i = 1, #ARGV do
  members[#members + 1] = last - n + i
  members[#members + 1] = ARGV[i]
end
for s = 1, #members, 1000 do
  redis.call('zadd', KEYS[1], 'NX', unpack(members, s, math.min(s + 999, #members)))
end
return n
"""
# KEYS: the organisation's held set, in-flight set and releasing hash. ARGV: how many to take at most,
# the cap, now, the release id. Takes no more than the cap allows now, and notes what it took.
_TAKE = """
local room = tonumber(ARGV[2]) - redis.call('zcard', KEYS[2])
local n = math.min(tonumber(ARGV[1]), room)
if n <= 0 then return {} end
local popped = redis.call('zpopmin', KEYS[1], n)
local taken = {}
for i = 1, #popped, 2 do
  redis.call('zadd', KEYS[2], ARGV[3], popped[i])
  taken[#taken + 1] = popped[i]
end
if #taken > 0 then
  redis.call('hset', KEYS[3], ARGV[4], cjson.encode({at = tonumber(ARGV[3]), turns = taken}))
end
return taken
"""
# KEYS: the organisations' set. ARGV: the organisation, the latest touch that lets it go.
_DROP_IDLE = """
local touched = redis.call('zscore', KEYS[1], ARGV[1])
if touched and tonumber(touched) <= tonumber(ARGV[2]) then return redis.call('zrem', KEYS[1], ARGV[1]) end
return 0
"""
# ``finished`` and ``leave``: with a second key (the held set, ``leave``), the turns leave it too.
_FINISHED = """
local removed = 0
for i = 1, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  if KEYS[2] then redis.call('zrem', KEYS[2], unpack(ARGV, i, last)) end
  removed = removed + redis.call('zrem', KEYS[1], unpack(ARGV, i, last))
end
return removed
"""
_NUDGE: list[Call] = [("LPUSH", ADMISSION_NUDGE_KEY, "1"), ("LTRIM", ADMISSION_NUDGE_KEY, 0, 0)]
"""Wake the scheduler: the nudge list holds at most one item."""


def leave_calls(client: redis.Redis) -> Callable[[str, Sequence[str]], list[Call]]:
    """What takes turns of an organisation out of its in-flight set and wakes the scheduler, as calls for
    :func:`~shared.state.scripts.pipelined` (the state store's last save sends them with its own, in its
    one round trip: so it wakes the scheduler whether or not the turn was in flight, which a turn whose
    chain ends nearly always is)."""
    script = client.register_script(_FINISHED)

    def calls(org_id: str, turn_ids: Sequence[str]) -> list[Call]:
        return [ScriptCall(script, [in_flight_key(org_id)], list(turn_ids)), *_NUDGE]

    return calls


@dataclass(frozen=True, slots=True)
class Admitted:
    """Turns that are never held (interactive turns, re-entries) counted in ``org_id``'s turns in flight from ``at``."""

    org_id: str
    at: float


def admit_calls(admitted: Admitted, turn_ids: Sequence[str]) -> list[Call]:
    """What counts ``turn_ids`` in flight as ``admitted`` says, as calls for :func:`~shared.state.scripts.pipelined`."""
    if not turn_ids:
        return []
    in_flight = [item for turn_id in turn_ids for item in (admitted.at, turn_id)]
    return [
        ("ZADD", ADMISSION_ORGS_KEY, admitted.at, admitted.org_id),
        ("ZADD", in_flight_key(admitted.org_id), *in_flight),
    ]


@dataclass(frozen=True, slots=True)
class Release:
    """Turns one release moved to in flight, under the id of their releasing notes (one per organisation)."""

    release_id: str
    turn_ids: list[str]
    orgs: tuple[str, ...] = field(default=())
    """The organisations whose releasing hashes hold the notes (what :meth:`AdmissionQueue.settle` deletes)."""


@dataclass(frozen=True, slots=True)
class DelayReport:
    """One worker process's last report: how long its step messages waited between their sending and their
    task's start (``workers.dispatch_delays``)."""

    least: float
    """The shortest wait, seconds: long only when every message waited (a queue that stays, not a burst)."""
    samples: int
    """How many task starts it covers."""
    at: float
    """When it was made (Unix time)."""


@dataclass(frozen=True, slots=True)
class OrgCounts:
    """An organisation's turns held and in flight."""

    held: int
    in_flight: int


class AdmissionQueue:
    """The held and in-flight sets of every organisation, on the state store's Redis (or Redis Cluster)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._hold = client.register_script(_HOLD)
        self._take = client.register_script(_TAKE)
        self._drop_idle = client.register_script(_DROP_IDLE)
        self._finished = client.register_script(_FINISHED)
        self._orgs_seen: list[str] = []
        """The organisations the last release saw: the next reads their counts with the organisations' list."""

    def hold(self, org_id: str, turn_ids: list[str], *, now: float | None = None) -> None:
        """Hold ``org_id``'s new batch turns (after those it holds already), all or none, and wake the
        scheduler; one round trip. ``now`` (Unix time, default the clock's) marks the organisation touched.

        Raises:
            redis.RedisError: Redis refused (nothing was held, or, on a cluster whose node failed in
                between, the turns were held and the organisation's touch or the nudge was lost: the next
                hold or the reconciler's check of held turns repairs that).
        """
        if not turn_ids:
            return
        touched = time.time() if now is None else now
        calls: list[Call] = [
            ("ZADD", ADMISSION_ORGS_KEY, repr(touched), org_id),
            ScriptCall(self._hold, [held_key(org_id), org_sequence_key(org_id)], turn_ids),
            *_NUDGE,
        ]
        pipelined(self.client, calls)

    def admit_now(self, org_id: str, turn_ids: list[str], *, now: float) -> None:
        """Count turns that are never held (interactive turns, re-entries) in flight from ``now`` (the state
        store's ``mark_alive(admitted=...)`` does it with the turns' markers, in their round trip).

        Raises:
            redis.RedisError: Redis refused.
        """
        if turn_ids:
            pipelined(self.client, admit_calls(Admitted(org_id, now), turn_ids))

    def release(
        self,
        *,
        cap: int,
        limit: int,
        now: float,
        caps: Mapping[str, int] | None = None,
        window: int | None = None,
        settled: Sequence[Release] = (),
    ) -> Release | None:
        """Move up to ``limit`` held turns to in flight, round-robin across organisations, none past its cap:
        ``caps[org]`` for an organisation with a cap of its own (``aptix orgs set --max-in-flight``), else ``cap``;
        and, given a ``window``, no more than leave every organisation's turns in flight at most ``window`` in all
        (``workers.admission_window``).

        Two round trips when the organisations are those the last release of this queue saw: the organisations,
        the cursor and those organisations' counts (with the deletion of the notes of ``settled``, releases whose
        first messages were sent since: what :meth:`settle` does, riding this round trip); then the moves (one
        script per organisation, each writing its releasing note in the same atomic step), the cursor, and the drop
        of idle organisations. An organisation new to this queue costs a round trip more, for its counts. None when
        nothing could be released.
        """
        orgs, cursor, counts = self._orgs_cursor_and_counts(settled)
        if not orgs:
            return None
        if window is not None:
            limit = min(limit, window - sum(flying for _, flying, _ in counts.values()))
            if limit <= 0:
                return None
        limits = {org: int((caps or {}).get(org, cap)) for org in orgs}
        room = {org: min(held, max(0, limits[org] - flying)) for org, (held, flying, _) in counts.items()}
        plan, last = _round_robin(sorted(orgs), cursor, room, limit)
        release_id = uuid.uuid4().hex
        calls: list[Call] = [
            ScriptCall(
                self._take,
                [held_key(org), in_flight_key(org), org_releasing_key(org)],
                [n, limits[org], repr(now), release_id],
            )
            for org, n in plan.items()
        ]
        idle_before = now - IDLE_ORG_SECONDS
        idle = [org for org, sizes in counts.items() if sizes == (0, 0, 0)]
        calls += [ScriptCall(self._drop_idle, [ADMISSION_ORGS_KEY], [org, repr(idle_before)]) for org in idle]
        if last is not None:
            calls.append(("SET", ADMISSION_CURSOR_KEY, last))
        replies = pipelined(self.client, calls)
        taken = {org: [_text(turn_id) for turn_id in reply] for org, reply in zip(plan, replies, strict=False)}
        turn_ids = _interleave([taken[org] for org in plan])
        if not turn_ids:
            return None
        return Release(release_id, turn_ids, tuple(org for org in plan if taken[org]))

    def settle(self, *releases: Release) -> None:
        """Delete releases' notes: their turns' first messages are sent (one round trip; :meth:`release` can do it
        in its first)."""
        if releases:
            pipelined(self.client, _settle_calls(releases))

    def stale_releases(self, *, now: float, older_than: float = REPUBLISH_AFTER_SECONDS) -> list[Release]:
        """The releasing notes written before ``now - older_than`` (their scheduler died before sending)."""
        orgs = self._orgs()
        if not orgs:
            return []
        with self.client.pipeline(transaction=False) as pipe:
            for org in orgs:
                pipe.hgetall(org_releasing_key(org))
            notes = pipe.execute()
        stale = []
        for org, held_notes in zip(orgs, notes, strict=True):
            for release_id, note in held_notes.items():
                parsed = json.loads(note)
                if float(parsed["at"]) <= now - older_than:
                    turns = parsed["turns"] if isinstance(parsed["turns"], list) else []  # cjson: {} for an empty list
                    stale.append(Release(_text(release_id), [str(turn_id) for turn_id in turns], (org,)))
        return stale

    def finished(self, org_id: str, turn_ids: Iterable[str]) -> int:
        """Turns of ``org_id`` that ended or paused: no longer in flight; wakes the scheduler if one was.

        Returns:
            How many were in flight.
        """
        ids = list(turn_ids)
        if not ids:
            return 0
        return self._leave([in_flight_key(org_id)], ids)

    def leave(self, org_id: str, turn_ids: Sequence[str]) -> int:
        """Turns of ``org_id`` that ended early leave admission (one round trip; two when one was in flight): a
        held one is never sent, a released one frees its slot (and wakes the scheduler, as :meth:`finished` does).

        Returns:
            How many were in flight.
        """
        if not turn_ids:
            return 0
        return self._leave([in_flight_key(org_id), held_key(org_id)], list(turn_ids))

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
        orgs = sorted(self._orgs())
        if not orgs:
            return {}
        return {org: OrgCounts(held, flying) for org, (held, flying, _) in self._counts(orgs).items()}

    def report_delay(self, worker: str, report: DelayReport) -> None:
        """Record ``worker``'s latest dispatch-delay report (one ``HSET``, replacing its last)."""
        fields = {"least": report.least, "samples": report.samples, "at": report.at}
        self.client.hset(ADMISSION_DELAYS_KEY, worker, json.dumps(fields))

    def delays(self, *, now: float) -> list[DelayReport]:
        """The workers' reports made in the last :data:`DELAY_FRESH_SECONDS`; deletes those of processes that
        stopped reporting a minute ago."""
        raw: dict[bytes, bytes] = self.client.hgetall(ADMISSION_DELAYS_KEY)  # type: ignore[assignment]
        fresh: list[DelayReport] = []
        gone: list[bytes] = []
        for worker, value in raw.items():
            try:
                fields = json.loads(value)
                report = DelayReport(float(fields["least"]), int(fields["samples"]), float(fields["at"]))
            except (ValueError, KeyError, TypeError):
                gone.append(worker)
                continue
            if report.at < now - _DELAY_FORGOTTEN_SECONDS:
                gone.append(worker)
            elif report.at >= now - DELAY_FRESH_SECONDS:
                fresh.append(report)
        if gone:
            self.client.hdel(ADMISSION_DELAYS_KEY, *gone)
        return fresh

    def wait(self, timeout: float) -> bool:
        """Block until nudged (turns held, a turn in flight ended) or ``timeout`` seconds; whether nudged."""
        return self.client.blpop([ADMISSION_NUDGE_KEY], timeout=timeout) is not None

    def _leave(self, keys: list[str], turn_ids: list[str]) -> int:
        """Take ``turn_ids`` out of the sets ``keys`` (one organisation's); nudge the scheduler when any was in
        flight (a second round trip then: the nudge is another slot's)."""
        removed = int(self._finished(keys=keys, args=turn_ids))
        if removed:
            pipelined(self.client, _NUDGE)
        return removed

    def _orgs(self) -> list[str]:
        orgs: list[bytes] = self.client.zrange(ADMISSION_ORGS_KEY, 0, -1)  # type: ignore[assignment]
        return [_text(org) for org in orgs]

    def _orgs_cursor_and_counts(self, settled: Sequence[Release]) -> tuple[list[str], str, dict[str, _Sizes]]:
        """The organisations, the cursor and each organisation's counts (with its releasing notes'), reading the counts
        of the organisations seen last time in the same round trip (and deleting ``settled``'s notes there); a second
        round trip for the counts of organisations new since."""
        seen = self._orgs_seen
        settles = _settle_calls(settled)
        calls: list[Call] = [
            *settles,
            ("ZRANGE", ADMISSION_ORGS_KEY, 0, -1),
            ("GET", ADMISSION_CURSOR_KEY),
            *_count_calls(seen, with_releasing=True),
        ]
        replies = pipelined(self.client, calls)[len(settles) :]
        orgs = [_text(org) for org in replies[0]]
        known = _sizes(seen, replies[2:], with_releasing=True)
        new = [org for org in orgs if org not in known]
        if new:
            known |= self._counts(new, with_releasing=True)
        self._orgs_seen = orgs
        return orgs, "" if replies[1] is None else _text(replies[1]), {org: known[org] for org in orgs}

    def _counts(self, orgs: Sequence[str], *, with_releasing: bool = False) -> dict[str, _Sizes]:
        """Each organisation's held, in-flight and (``with_releasing``) releasing-note counts, one round trip."""
        return _sizes(orgs, pipelined(self.client, _count_calls(orgs, with_releasing=with_releasing)),
                      with_releasing=with_releasing)  # fmt: skip


_Sizes = tuple[int, int, int]
"""An organisation's turns held, in flight, and releasing notes (0 when not read)."""


def _settle_calls(releases: Iterable[Release]) -> list[Call]:
    """What deletes the releasing notes of ``releases``."""
    return [("HDEL", org_releasing_key(org), release.release_id) for release in releases for org in release.orgs]


def _count_calls(orgs: Iterable[str], *, with_releasing: bool) -> list[Call]:
    """What reads each organisation's held and in-flight counts (and its releasing notes')."""
    calls: list[Call] = []
    for org in orgs:
        calls += [("ZCARD", held_key(org)), ("ZCARD", in_flight_key(org))]
        if with_releasing:
            calls.append(("HLEN", org_releasing_key(org)))
    return calls


def _sizes(orgs: Sequence[str], replies: Sequence[int], *, with_releasing: bool) -> dict[str, _Sizes]:
    """The counts :func:`_count_calls` read, by organisation."""
    width = 3 if with_releasing else 2
    return {
        org: (
            int(replies[width * i]),
            int(replies[width * i + 1]),
            int(replies[width * i + 2]) if with_releasing else 0,
        )
        for i, org in enumerate(orgs)
    }


def _round_robin(orgs: list[str], cursor: str, room: dict[str, int], limit: int) -> tuple[dict[str, int], str | None]:
    """How many turns each organisation releases: one per organisation per round, starting after ``cursor``
    (``orgs`` sorted), none past its ``room``, ``limit`` in all; and the organisation served last."""
    start = next((i for i, org in enumerate(orgs) if org > cursor), 0)
    order = orgs[start:] + orgs[:start]
    plan: dict[str, int] = {}
    total, last, progress = 0, None, True
    while progress and total < limit:
        progress = False
        for org in order:
            if total >= limit:
                break
            if plan.get(org, 0) < room.get(org, 0):
                plan[org] = plan.get(org, 0) + 1
                total, last, progress = total + 1, org, True
    return plan, last


def _interleave(lists: list[list[str]]) -> list[str]:
    """The items of ``lists`` one from each in turn (the order a round-robin release sends them in)."""
    out: list[str] = []
    for index in range(max((len(items) for items in lists), default=0)):
        out += [items[index] for items in lists if index < len(items)]
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
