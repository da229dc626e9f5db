"""Ground truth after a fault: the turn rows in the database, the tool log and the model's journal.

Nothing here comes from what the harness assumed: a turn's key is read back from its stored
request, a tool run is a line the tool itself appended, a model call is a request body the
scripted model received.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import redis

from aptix_cli.batch_progress import IN_FLIGHT
from scripted_llm.script import last_user_text
from shared.redis_clients import redis_client
from shared.state.keys import alive_key, claim_key, events_key, state_key, version_key
from shared.turn_events import PAUSE_EVENT
from tests.chaos.load import key_of
from tests.chaos.system import ChaosSystem

__all__ = ["Evidence", "TurnRecord", "collect"]


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One row of the ``turns`` table, reduced to what the report counts."""

    turn_id: str
    key: str | None
    """The chaos key read from the stored input (None: not a chaos turn)."""
    status: str
    error_code: str | None
    output_text: str | None
    redrives: int
    """How often the reconciler sent the stalled turn on again."""
    created_at: float
    """When the gateway recorded it (POSIX seconds)."""
    completed_at: float | None = None
    """When the turn completed (Unix time), if it did."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the system did, read after the fault."""

    turns: list[TurnRecord]
    tool_runs: Counter[str]
    """Lines of the tool log per key: how often ``count_run`` ran for each turn."""
    model_calls: Counter[str]
    """Model requests per turn key."""
    other_model_calls: int
    """Model requests whose last user text carries no chaos key."""
    post_mortem: dict[str, str]
    """Turn id -> what the database and Redis held about it, for each turn not yet ended."""
    snapshots_behind: list[str]
    """Keys of ended turns whose database checkpoint says a status other than their row's: a late write from
    a stale worker put the turn's checkpoint back behind its commit point."""
    stalls: dict[str, float]
    """Turn key -> the longest its clients saw nothing happen: the longest gap from its creation to its
    first event or between two of its events (Redis stamps them with its own clock), a wait for the
    client's tool results aside."""


def collect(system: ChaosSystem) -> Evidence:
    """Read the turn rows, the tool log and the model journal (including earlier model processes').

    Raises:
        psycopg.OperationalError: the database did not answer for 30 s.
        httpx.HTTPError: the model's journal could not be read.
    """
    model_calls: Counter[str] = Counter()
    other = 0
    for body in system.model_journal():
        key = key_of(last_user_text(body.get("input"))) if isinstance(body, dict) else None
        if key is None:
            other += 1
        else:
            model_calls[key] += 1
    lines = system.tool_log.read_text(encoding="utf-8").splitlines() if system.tool_log.exists() else []
    turns = _turn_rows(system.database.url)
    return Evidence(
        turns=turns,
        tool_runs=Counter(line for line in lines if line),
        model_calls=model_calls,
        other_model_calls=other,
        post_mortem=_post_mortem(system, [turn.turn_id for turn in turns if turn.status in IN_FLIGHT]),
        snapshots_behind=_snapshots_behind(system.database.url, turns),
        stalls=_stalls(system, turns),
    )


def _snapshots_behind(database_url: str, turns: list[TurnRecord]) -> list[str]:
    """The keys of settled turns whose checkpoint's status is not their row's (the commit writes both)."""
    with psycopg.connect(database_url, connect_timeout=5) as conn:
        rows = conn.execute("SELECT turn_id, state ->> 'status' FROM provider_snapshots").fetchall()
    snapshot_status = {str(turn_id): status for turn_id, status in rows}
    return sorted(
        turn.key or turn.turn_id
        for turn in turns
        if turn.status in {"completed", "failed", "requires_client_tools"}
        and turn.turn_id in snapshot_status
        and snapshot_status[turn.turn_id] != turn.status
    )


def _stalls(system: ChaosSystem, turns: list[TurnRecord]) -> dict[str, float]:
    """Each keyed turn's longest gap in its event log (best effort: {} when Redis does not answer)."""
    client = redis_client(system.state_url, socket_timeout=10)
    found: dict[str, float] = {}
    try:
        for turn in turns:
            if turn.key is None:
                continue
            since, longest, paused = turn.created_at, 0.0, False
            entries: list[tuple[bytes, dict[bytes, bytes]]] = client.xrange(events_key(turn.turn_id))  # type: ignore[assignment]
            for entry_id, fields in entries:
                stamp = int(entry_id.split(b"-")[0]) / 1000.0
                if not paused:  # the wait for the client's tool results is the client's, not a stall
                    longest = max(longest, stamp - since)
                paused = fields.get(b"event") == PAUSE_EVENT.encode()
                since = stamp
            found[turn.key] = longest
    except redis.RedisError:
        return found
    finally:
        client.close()
    return found


def _post_mortem(system: ChaosSystem, turn_ids: list[str]) -> dict[str, str]:
    """For each turn still in flight: its row's clock fields and what Redis holds (best effort)."""
    if not turn_ids:
        return {}
    found: dict[str, str] = {}
    try:
        with psycopg.connect(system.database.url, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT turn_id, round, redrives, updated_at, deadline_at FROM turns WHERE turn_id = ANY(%s)",
                (turn_ids,),
            ).fetchall()
        client = redis_client(system.state_url, socket_timeout=5)
        now = time.time()
        for turn_id, round_, redrives, updated_at, deadline_at in rows:
            raw = client.get(state_key(turn_id))
            state = json.loads(raw) if raw else None
            raw_marker = client.get(alive_key(turn_id))
            marker = None if raw_marker is None else float(raw_marker)
            leases = [
                f"{key.decode().rsplit(':claim:', 1)[1]}(ttl {client.ttl(key)})"
                for key in client.scan_iter(claim_key(turn_id, "*"))
            ]
            found[turn_id] = (
                f"round {round_}, redrives {redrives}, updated {updated_at:%H:%M:%S}, deadline "
                f"{'-' if deadline_at is None else f'{deadline_at:%H:%M:%S}'}; Redis: marker "
                f"{'-' if marker is None else f'{marker - now:+.0f} s'}, leases {leases or '-'}, version "
                f"{client.get(version_key(turn_id))!r}, state "
                + ("-" if state is None else f"steps {list(state.get('steps_done', {}))} next "
                   f"{(state.get('next_envelope') or {}).get('step')!r}")
            )  # fmt: skip
    except (psycopg.Error, redis.RedisError, ValueError) as exc:
        found.setdefault("", f"post-mortem failed: {type(exc).__name__}: {exc}")
    return found


def _turn_rows(database_url: str) -> list[TurnRecord]:
    query = "SELECT turn_id, status, error, request, output_text, redrives, created_at, completed_at FROM turns"
    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(database_url, connect_timeout=5) as conn:
                rows = conn.execute(query).fetchall()
            break
        except psycopg.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1)
    return [
        TurnRecord(
            turn_id=str(turn_id),
            key=key_of(_input(request)),
            status=str(status),
            error_code=_code(error),
            output_text=output_text,
            redrives=int(redrives),
            created_at=created_at.timestamp(),
            completed_at=_unix(completed_at),
        )
        for turn_id, status, error, request, output_text, redrives, created_at, completed_at in rows
    ]


def _unix(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _input(request: Any) -> str:
    value = request.get("input") if isinstance(request, dict) else None
    return value if isinstance(value, str) else ""


def _code(error: Any) -> str | None:
    if error is None:
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code else "unknown"
