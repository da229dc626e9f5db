"""Ground truth after a fault: the turn rows in the database, the tool log and the model's journal.

Nothing here comes from what the harness assumed: a turn's key is read back from its stored
request, a tool run is a line the tool itself appended, a model call is a request body the
scripted model received.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import psycopg

from scripted_llm.script import last_user_text
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
    return Evidence(
        turns=_turn_rows(system.database.url),
        tool_runs=Counter(line for line in lines if line),
        model_calls=model_calls,
        other_model_calls=other,
    )


def _turn_rows(database_url: str) -> list[TurnRecord]:
    query = "SELECT turn_id, status, error, request, output_text FROM turns"
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
        )
        for turn_id, status, error, request, output_text in rows
    ]


def _input(request: Any) -> str:
    value = request.get("input") if isinstance(request, dict) else None
    return value if isinstance(value, str) else ""


def _code(error: Any) -> str | None:
    if error is None:
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code else "unknown"
