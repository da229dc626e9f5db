"""Streaming and non-streaming runs of the same scripted turn record identical turns (real gateway and
worker processes): the turn as GET shows it, the transcript, the model's output items and the tool
ledger in the turn's durable snapshot, the trace's model calls and the requests the model received;
only the streamed run's event log holds the model's text, and it joins to the turn's output_text."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select

from shared.db import create_db_engine, session_factory
from shared.db.tables import TranscriptItemRow
from shared.db.turns import TurnRepository
from shared.turn_events import RedisTurnEventLog
from tests.integration.conftest import OPEN_FILE, System

pytestmark = pytest.mark.integration

TOOL_KEY = "i13-streamed-same-turn"
_IDS = re.compile(r"\b(?:resp|msg|fc|call|turn|sess)_[0-9a-zA-Z]{8,}\b")
_STATE_FIELDS = ("transcript", "last_response", "ledger", "output_text", "usage", "pending_tool_calls", "mode",
                 "mode_changes", "status", "error", "exit_mode")  # fmt: skip
_TURN_FIELDS = ("status", "mode", "mode_changes", "output_text", "pending_tool_calls", "error", "usage")


@pytest.fixture(scope="module")
def engine(system: System) -> Iterator[Engine]:
    created = create_db_engine(system.env["APTIX_DATABASE_URL"])
    yield created
    created.dispose()


@pytest.mark.parametrize(
    ("scenario", "body", "results"),
    [
        ("text answer", {"input": "Tell me [[say:The answer is 42, as it was and as it always will be.]]"}, None),
        ("server tool, then text", {"input": f'Count [[call:record_call {{"key": "{TOOL_KEY}"}}]] please'}, None),
        ("client tool", {"input": 'Open it [[call:open_file {"path": "/tmp/notes.txt"}]]', "tools": [OPEN_FILE]},
         "line one\nline two"),
    ],
)  # fmt: skip
def test_a_streamed_turn_records_what_the_same_turn_records_without_streaming(
    system: System, engine: Engine, scenario: str, body: dict[str, Any], results: str | None
) -> None:
    # Given the same turn, run once without streaming and once streaming (each in a new session)
    marker = f"m{uuid.uuid4().hex[:12]}"
    body = {**body, "input": f"{marker} {body['input']}"}
    runs = {stream: _run(system, body, stream=stream, results=results) for stream in (False, True)}

    # Then both recorded the same turn
    whole, streamed = (_recorded(system, engine, runs[stream]) for stream in (False, True))
    assert streamed == whole, scenario
    assert whole["turn"]["status"] == "completed"
    assert whole["turn"]["output_text"]
    # and the model received the same requests, the streamed run's asking to stream
    whole_requests, streamed_requests = _requests(system, marker)
    assert len(whole_requests) == whole["turn"]["usage"]["llm_calls"]
    assert [request.pop("stream") for request in streamed_requests] == [True] * len(whole_requests)
    assert _normalised(streamed_requests) == _normalised(whole_requests)
    # and only the streamed run's event log holds the model's text, which joins to its output_text
    assert _relayed_text(system, runs[False]) is None
    assert _relayed_text(system, runs[True]) == streamed["turn"]["output_text"]


def _run(system: System, body: dict[str, Any], *, stream: bool, results: str | None) -> str:
    """Start the turn (streamed or not), carry it through a client-tool pause, wait for its end; its id."""
    system.redis.delete(f"aptix:test:calls:{TOOL_KEY}")  # record_call answers with its count: start both at 1
    turn_id = _start(system, {**body, "stream": True} if stream else body)
    turn = system.wait_turn(turn_id)
    if results is not None:
        assert turn["status"] == "requires_client_tools", turn
        answers = [{"call_id": call["call_id"], "output": results} for call in turn["pending_tool_calls"]]
        turn = system.resume(turn_id, answers)
    assert turn["status"] == "completed", turn
    return turn_id


def _start(system: System, body: dict[str, Any]) -> str:
    """POST the turn. A streaming turn may be answered with its events (once the gateway serves them;
    the stream ends when the round does): the text they show must then be the text the model wrote."""
    with system.http.stream("POST", "/v1/turns", json=body, headers=system.headers()) as answer:
        answer.read()
        assert answer.status_code in (200, 202), answer.text
        if not answer.headers["content-type"].startswith("text/event-stream"):
            return str(answer.json()["turn_id"])
    named = []
    for block in answer.text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "data" in fields:
            named.append((fields.get("event", "message"), json.loads(fields["data"])))
    turn = named[-1][1]
    assert named[-1][0] in ("turn.completed", "turn.requires_client_tools"), named[-1]
    assert _visible(named) == (turn["output_text"] or ""), named
    return str(turn["turn_id"])


def _recorded(system: System, engine: Engine, turn_id: str) -> dict[str, Any]:
    turn = system.http.get(f"/v1/turns/{turn_id}", headers=system.headers()).json()
    snapshot = TurnRepository(session_factory(engine)).load_snapshot(turn_id)
    assert snapshot is not None
    with engine.connect() as db:
        rows = db.execute(
            select(TranscriptItemRow.seq, TranscriptItemRow.role, TranscriptItemRow.content)
            .where(TranscriptItemRow.turn_id == turn_id)
            .order_by(TranscriptItemRow.seq)
        ).all()
    model_calls = [
        {key: step["data"].get(key) for key in ("input_tokens", "output_tokens", "function_calls", "tools_offered")}
        for step in system.trace(turn_id)
        if step["kind"] in ("llm_call", "llm_error")
    ]
    return _normalised(
        {
            "turn": {field: turn[field] for field in _TURN_FIELDS},
            "transcript": [tuple(row) for row in rows],
            "state": {field: snapshot.get(field) for field in _STATE_FIELDS},
            "model_calls": model_calls,
        }
    )


def _requests(system: System, marker: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The bodies the model received with ``marker`` in them: (without streaming, streaming), oldest first."""
    bodies = [entry["body"] for entry in system.llm.requests(marker)]
    return [body for body in bodies if "stream" not in body], [body for body in bodies if "stream" in body]


def _relayed_text(system: System, turn_id: str) -> str | None:
    """The text a client following the turn shows (the deltas, minus those withdrawn), None without any."""
    log = RedisTurnEventLog(system.redis, ttl_seconds=600, max_events=10_000)
    events = [(event.event, event.data) for event in log.read(turn_id, after=None, block_ms=0, count=100_000)]
    return _visible(events) if any(name == "output_text.delta" for name, _ in events) else None


def _visible(events: list[tuple[str, Any]]) -> str:
    """The deltas joined, the last N dropped at each ``output_text.reset``."""
    kept: list[str] = []
    for name, data in events:
        if name == "output_text.delta":
            kept.append(data["delta"])
        elif name == "output_text.reset":
            del kept[len(kept) - data["deltas"] :]
    return "".join(kept)


def _normalised(value: Any) -> Any:
    """``value`` with the ids the model and the gateway assign per call (resp_, msg_, fc_, call_, turn_,
    sess_) replaced by their order of first appearance, as JSON."""
    seen: dict[str, str] = {}

    def name(match: re.Match[str]) -> str:
        return seen.setdefault(match.group(0), f"<id{len(seen)}>")

    return json.loads(_IDS.sub(name, json.dumps(value, sort_keys=True, default=str)))


@pytest.mark.parametrize(
    ("directive", "withdrawn"),
    [("[[fail:500:1]]", False), ("[[midfail:server_error:1]]", True), ("[[cut:6:1]]", True)],
)
def test_a_streamed_call_retried_after_a_failure_leaves_only_the_answer_visible(
    system: System, directive: str, withdrawn: bool
) -> None:
    # Given a streaming turn whose first model call fails (before its stream, mid-stream, or by a cut)
    marker = f"m{uuid.uuid4().hex[:12]}"

    # When it runs, the step trying the model again after its back-off
    turn_id = _run(system, {"input": f"{marker} retried {directive}"}, stream=True, results=None)

    # Then the failed call's text, if it sent any, was withdrawn, and what a client shows is the answer
    turn = system.http.get(f"/v1/turns/{turn_id}", headers=system.headers()).json()
    assert turn["output_text"] == f"Echo: {marker} retried {directive}"
    assert [step["kind"] for step in system.trace(turn_id) if step["kind"].startswith("llm")] == [
        "llm_error",
        "llm_call",
    ]
    log = RedisTurnEventLog(system.redis, ttl_seconds=600, max_events=10_000)
    names = [event.event for event in log.read(turn_id, after=None, block_ms=0, count=100_000)]
    assert ("output_text.reset" in names) is withdrawn
    assert _relayed_text(system, turn_id) == turn["output_text"]
