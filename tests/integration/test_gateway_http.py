"""The gateway's HTTP contract over real HTTP: auth, org scoping, validation, limits, conflicts, health.

Every refused request is checked for the one error body ``{"error": {"code", "message", "details"}}``
and, where it could have recorded something, for having changed nothing in the database.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from shared.db.migrate import head_revision, upgrade
from shared.db.tables import SessionRow, TurnRow
from tests.conftest import KEY_A, KEY_B, ORG_A, ORG_B
from tests.integration.conftest import System
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

MAX_BODY_BYTES = 65536
UNKNOWN_TURN_ID = "turn_" + "0" * 32
UNKNOWN_SESSION_ID = "sess_" + "0" * 32


def _marker() -> str:
    return f"m{uuid.uuid4().hex[:10]}"


def _counts(engine: Engine, org_id: str) -> tuple[int, int]:
    """(sessions, turns) of ``org_id``, once none of its turns is still queued or running.

    Sessions are created by a worker step, so an in-flight turn of an earlier test could still add one.
    """
    with engine.connect() as conn:

        def settled() -> bool:
            in_flight = conn.scalar(
                select(func.count())
                .select_from(TurnRow)
                .where(TurnRow.org_id == org_id, TurnRow.status.in_(("queued", "running")))
            )
            conn.rollback()
            return not in_flight

        wait_for(settled, what=f"the turns of {org_id} to settle", interval=0.1)
        sessions = conn.scalar(select(func.count()).select_from(SessionRow).where(SessionRow.org_id == org_id))
        turns = conn.scalar(select(func.count()).select_from(TurnRow).where(TurnRow.org_id == org_id))
    return int(sessions or 0), int(turns or 0)


def _assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The response has ``status`` and the error body (with ``code`` when given); returns the error."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


# --- 401 -------------------------------------------------------------------------------------------

_BAD_AUTH = {
    "missing": None,
    "unknown key": "Bearer not-a-key",
    "bearer without a key": "Bearer",
    "basic scheme": "Basic dGVzdC1rZXktYTo=",
    "token scheme": f"Token {KEY_A}",
    "no scheme": KEY_A,
    "key of another case": f"Bearer {KEY_A.upper()}",
}
_AUTHENTICATED_ROUTES = [
    ("POST", "/v1/turns"),
    ("GET", f"/v1/turns/{UNKNOWN_TURN_ID}"),
    ("GET", f"/v1/sessions/{UNKNOWN_SESSION_ID}"),
    ("GET", "/v1/modes"),
]


@pytest.mark.parametrize("authorization", list(_BAD_AUTH.values()), ids=list(_BAD_AUTH))
@pytest.mark.parametrize(("method", "path"), _AUTHENTICATED_ROUTES, ids=[f"{m} {p}" for m, p in _AUTHENTICATED_ROUTES])
def test_route_is_401_when_the_api_key_is_missing_or_bad(
    system: System, engine: Engine, method: str, path: str, authorization: str | None
) -> None:
    # Given a request without a valid bearer key
    headers = {"Authorization": authorization} if authorization is not None else {}
    json_body = {"input": f"unauthorised {_marker()}"} if method == "POST" else None
    before = _counts(engine, ORG_A), _counts(engine, ORG_B)
    # When it is sent
    response = system.http.request(method, path, json=json_body, headers=headers)
    # Then it is refused with 401, the error body and a Bearer challenge, and nothing was recorded
    _assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"
    assert (_counts(engine, ORG_A), _counts(engine, ORG_B)) == before


_INVALID_BODIES_WITHOUT_AUTH: dict[str, dict[str, Any]] = {
    "not json": {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
    "invalid utf-8": {"content": b'{"input": "\xff\xfe"}', "headers": {"Content-Type": "application/json"}},
    "input not a string": {"json": {"input": 5}},
    "json array": {"json": [1, 2]},
    "empty body": {"content": b"", "headers": {"Content-Type": "application/json"}},
    "bad wait": {"json": {"input": "hi"}, "params": {"wait": "abc"}},
}


@pytest.mark.parametrize(
    "request_kwargs", list(_INVALID_BODIES_WITHOUT_AUTH.values()), ids=list(_INVALID_BODIES_WITHOUT_AUTH)
)
def test_post_turn_is_401_not_422_when_an_invalid_body_comes_without_a_key(
    system: System, engine: Engine, request_kwargs: dict[str, Any]
) -> None:
    # Given an invalid request and no key
    before = _counts(engine, ORG_A)
    # When it is posted
    response = system.http.post("/v1/turns", **request_kwargs)
    # Then the key is checked first: 401, and nothing was recorded
    _assert_error(response, 401, "unauthorized")
    assert _counts(engine, ORG_A) == before


# --- org scoping -----------------------------------------------------------------------------------


def test_turn_and_session_are_404_when_another_org_asks(system: System, engine: Engine) -> None:
    # Given a completed turn (and its session) of org A
    turn = system.run_turn({"input": f"org a {_marker()}"})
    session_path = f"/v1/sessions/{turn['session_id']}"
    session_before = system.http.get(session_path, headers=system.headers(KEY_A)).json()
    counts_before = _counts(engine, ORG_A), _counts(engine, ORG_B)
    # When org B reads the turn and the session, and posts a follow-up to that session
    turn_for_b = system.http.get(f"/v1/turns/{turn['turn_id']}", headers=system.headers(KEY_B))
    waited_for_b = system.http.get(f"/v1/turns/{turn['turn_id']}", headers=system.headers(KEY_B), params={"wait": 1})
    session_for_b = system.http.get(session_path, headers=system.headers(KEY_B))
    follow_up_for_b = system.post_turn({"session_id": turn["session_id"], "input": "hijack"}, key=KEY_B)
    follow_up_waiting = system.post_turn({"session_id": turn["session_id"], "input": "hijack"}, key=KEY_B, wait=5)
    # Then all are 404, exactly as for ids that do not exist
    _assert_error(turn_for_b, 404, "not_found")
    _assert_error(waited_for_b, 404, "not_found")
    _assert_error(session_for_b, 404, "session_not_found")
    _assert_error(follow_up_for_b, 404, "session_not_found")
    _assert_error(follow_up_waiting, 404, "session_not_found")
    unknown = system.http.get(f"/v1/turns/{UNKNOWN_TURN_ID}", headers=system.headers(KEY_B)).json()
    assert turn_for_b.json()["error"]["message"].replace(turn["turn_id"], "ID") == unknown["error"]["message"].replace(
        UNKNOWN_TURN_ID, "ID"
    )
    # And nothing changed for org A (or for org B)
    assert (_counts(engine, ORG_A), _counts(engine, ORG_B)) == counts_before
    assert system.http.get(f"/v1/turns/{turn['turn_id']}", headers=system.headers(KEY_A)).json() == turn
    assert system.http.get(session_path, headers=system.headers(KEY_A)).json() == session_before
    assert [t["turn_id"] for t in session_before["turns"]] == [turn["turn_id"]]


# --- 404 -------------------------------------------------------------------------------------------

_GARBAGE_IDS = {
    "well formed unknown turn": UNKNOWN_TURN_ID,
    "well formed unknown session": UNKNOWN_SESSION_ID,
    "short word": "nope",
    "percent nul": "%00",
    "prefixed nul": "turn_%00",
    "percent space": "%20",
    "very long": "x" * 4000,
    "very long prefixed": "turn_" + "a" * 4000,
    "unicode": "tür_ünïcødé_💥",
    "upper hex": "turn_" + "A" * 32,
    "sql": "' OR 1=1 --",
    "dots": "..",
    "encoded slash": "..%2F..%2Fetc",
    "percent garbage": "%ff%fe",
}


@pytest.mark.parametrize("raw_id", list(_GARBAGE_IDS.values()), ids=list(_GARBAGE_IDS))
@pytest.mark.parametrize("resource", ["turns", "sessions"])
def test_get_is_404_with_the_error_body_when_the_id_is_unknown_or_garbage(
    system: System, resource: str, raw_id: str
) -> None:
    # When a turn or session is read by an id that is unknown, malformed or hostile
    response = system.http.get(f"/v1/{resource}/{raw_id}", headers=system.headers())
    # Then it is 404 with the error body (never 400 or 500)
    _assert_error(response, 404)


def test_follow_up_is_404_when_the_session_id_is_unknown_or_garbage(system: System, engine: Engine) -> None:
    before = _counts(engine, ORG_A)
    for session_id in (UNKNOWN_SESSION_ID, "nope", "sess_💥", "sess_" + "f" * 31, "s" * 128):
        response = system.post_turn({"session_id": session_id, "input": "follow up"})
        _assert_error(response, 404, "session_not_found")
    assert _counts(engine, ORG_A) == before


# --- 422 -------------------------------------------------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"p": schema}}
    return schema


_INVALID_REQUESTS: dict[str, dict[str, Any]] = {
    "missing input": {"json": {"mode": "general"}},
    "empty input": {"json": {"input": ""}},
    "blank input": {"json": {"input": " \n\t "}},
    "input not a string": {"json": {"input": 42}},
    "input a list": {"json": {"input": ["hi"]}},
    "extra unknown field": {"json": {"input": "hi", "temperature": 0.2}},
    "body not json": {"content": b"input=hi", "headers": {"Content-Type": "application/json"}},
    "json array body": {"json": [{"input": "hi"}]},
    "json string body": {"json": "hi"},
    "json null body": {"content": b"null", "headers": {"Content-Type": "application/json"}},
    "tool with a bad name": {"json": {"input": "hi", "tools": [{"type": "function", "name": "open file!"}]}},
    "tool with an empty name": {"json": {"input": "hi", "tools": [{"type": "function", "name": ""}]}},
    "tool name too long": {"json": {"input": "hi", "tools": [{"type": "function", "name": "t" * 65}]}},
    "duplicate tool names": {
        "json": {
            "input": "hi",
            "tools": [{"type": "function", "name": "open_file"}, {"type": "function", "name": "open_file"}],
        }
    },
    "client tool named get_current_time": {
        "json": {"input": "hi", "tools": [{"type": "function", "name": "get_current_time"}]}
    },
    "client tool named agent_change_mode": {
        "json": {"input": "hi", "tools": [{"type": "function", "name": "agent_change_mode"}]}
    },
    "tool of another type": {"json": {"input": "hi", "tools": [{"type": "web_search", "name": "search"}]}},
    "tool parameters not an object schema": {
        "json": {"input": "hi", "tools": [{"type": "function", "name": "t", "parameters": {"type": "string"}}]}
    },
    "metadata with a non-string value": {"json": {"input": "hi", "metadata": {"priority": 1}}},
    "metadata with a nested value": {"json": {"input": "hi", "metadata": {"k": {"a": "b"}}}},
    "metadata a list": {"json": {"input": "hi", "metadata": ["a"]}},
    "nul in input": {"json": {"input": "a\x00b"}},
    "nul in metadata": {"json": {"input": "hi", "metadata": {"k": "v\x00"}}},
    "nul in mode": {"json": {"input": "hi", "mode": "gen\x00eral"}},
    "nul in tool description": {
        "json": {"input": "hi", "tools": [{"type": "function", "name": "t", "description": "d\x00"}]}
    },
    "nul in tool parameters": {
        "json": {
            "input": "hi",
            "tools": [{"type": "function", "name": "t", "parameters": {"type": "object", "description": "d\x00"}}],
        }
    },
    "nul in a tool parameters key": {
        "json": {
            "input": "hi",
            "tools": [{"type": "function", "name": "t", "parameters": {"type": "object", "properties": {"p\x00": {}}}}],
        }
    },
    "lone surrogate in input": {
        "content": b'{"input": "hi \\ud800"}',
        "headers": {"Content-Type": "application/json"},
    },
    "lone surrogate in metadata": {
        "content": b'{"input": "hi", "metadata": {"k": "\\udfff"}}',
        "headers": {"Content-Type": "application/json"},
    },
    "lone surrogate in tool parameters": {
        "content": b'{"input": "hi", "tools": [{"name": "t", "parameters": {"type": "object", "title": "\\ud800"}}]}',
        "headers": {"Content-Type": "application/json"},
    },
    "lone surrogate in a metadata key": {
        "content": b'{"input": "hi", "metadata": {"\\ud800": "v"}}',
        "headers": {"Content-Type": "application/json"},
    },
    "lone surrogate as an unknown field name": {
        "content": b'{"input": "hi", "\\udfff": 1}',
        "headers": {"Content-Type": "application/json"},
    },
    "lone surrogate in a tool parameters key": {
        "content": b'{"input": "hi", "tools": [{"name": "t", "parameters": {"type": "object", "\\ud800": {}}}]}',
        "headers": {"Content-Type": "application/json"},
    },
    "NaN in tool parameters": {
        "content": b'{"input": "hi", "tools": [{"name": "t", "parameters": {"type": "object", "maximum": NaN}}]}',
        "headers": {"Content-Type": "application/json"},
    },
    "Infinity in tool parameters": {
        "content": b'{"input": "hi", "tools": [{"name": "t", "parameters": {"type": "object", "minimum": -Infinity}}]}',
        "headers": {"Content-Type": "application/json"},
    },
    "1e999 in tool parameters": {
        "content": b'{"input": "hi", "tools": [{"name": "t", "parameters": {"type": "object", "maximum": 1e999}}]}',
        "headers": {"Content-Type": "application/json"},
    },
    "tool parameters nested too deep": {
        "json": {"input": "hi", "tools": [{"type": "function", "name": "t", "parameters": _nested(100)}]},
    },
    "wait over 60": {"json": {"input": "hi"}, "params": {"wait": "61"}},
    "wait not a number": {"json": {"input": "hi"}, "params": {"wait": "abc"}},
    "wait negative": {"json": {"input": "hi"}, "params": {"wait": "-1"}},
    "wait infinite": {"json": {"input": "hi"}, "params": {"wait": "inf"}},
    "wait nan": {"json": {"input": "hi"}, "params": {"wait": "nan"}},
    "mode too long": {"json": {"input": "hi", "mode": "m" * 65}},
    "unknown mode": {"json": {"input": "hi", "mode": "no-such-mode"}},
    "idempotency key too long": {"json": {"input": "hi", "idempotency_key": "k" * 256}},
}


@pytest.mark.parametrize("request_kwargs", list(_INVALID_REQUESTS.values()), ids=list(_INVALID_REQUESTS))
def test_post_turn_is_422_and_records_nothing_when_the_request_is_invalid(
    system: System, engine: Engine, request_kwargs: dict[str, Any]
) -> None:
    # Given an invalid TurnRequest from org A
    before = _counts(engine, ORG_A)
    kwargs = dict(request_kwargs)
    headers = {**system.headers(), **kwargs.pop("headers", {})}
    # When it is posted
    response = system.http.post("/v1/turns", headers=headers, **kwargs)
    # Then it is 422 invalid_request with a list of details, and no session or turn was recorded
    error = _assert_error(response, 422, "invalid_request")
    assert isinstance(error["details"], list) and error["details"], error
    assert all({"loc", "msg", "type"} <= set(detail) for detail in error["details"]), error
    assert _counts(engine, ORG_A) == before


def test_get_turn_is_422_when_wait_is_out_of_range(system: System) -> None:
    turn = system.run_turn({"input": f"wait range {_marker()}"})
    for wait in ("61", "-1", "abc", "nan"):
        response = system.http.get(f"/v1/turns/{turn['turn_id']}", headers=system.headers(), params={"wait": wait})
        error = _assert_error(response, 422, "invalid_request")
        assert isinstance(error["details"], list)


# --- 413 -------------------------------------------------------------------------------------------


def _oversized_body() -> bytes:
    body = b'{"input": "' + b"x" * MAX_BODY_BYTES + b'"}'
    assert len(body) > MAX_BODY_BYTES
    return body


def test_post_turn_is_413_when_the_declared_body_is_too_large(system: System, engine: Engine) -> None:
    before = _counts(engine, ORG_A)
    headers = {**system.headers(), "Content-Type": "application/json"}
    response = system.http.post("/v1/turns", content=_oversized_body(), headers=headers)
    _assert_error(response, 413, "request_too_large")
    assert _counts(engine, ORG_A) == before


def test_post_turn_is_413_when_a_chunked_body_grows_too_large(system: System, engine: Engine) -> None:
    # Given a body sent chunked, with no Content-Length
    before = _counts(engine, ORG_A)
    body = _oversized_body()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 8192):
            yield body[start : start + 8192]

    headers = {**system.headers(), "Content-Type": "application/json"}
    request = system.http.build_request("POST", "/v1/turns", content=chunks(), headers=headers)
    assert "content-length" not in request.headers and request.headers["transfer-encoding"] == "chunked"
    # When it is posted
    response = system.http.send(request)
    # Then the limit still applies
    _assert_error(response, 413, "request_too_large")
    assert _counts(engine, ORG_A) == before


def test_post_turn_is_413_without_a_key_when_the_body_is_too_large(system: System) -> None:
    response = system.http.post("/v1/turns", content=_oversized_body(), headers={"Content-Type": "application/json"})
    _assert_error(response, 413, "request_too_large")


def test_post_turn_is_accepted_when_the_body_is_exactly_at_the_limit(system: System) -> None:
    # Given a body of exactly APTIX_MAX_BODY_BYTES
    marker = _marker()
    prefix, suffix = b'{"input": "' + marker.encode() + b" ", b'"}'
    body = prefix + b"y" * (MAX_BODY_BYTES - len(prefix) - len(suffix)) + suffix
    assert len(body) == MAX_BODY_BYTES
    # When it is posted
    headers = {**system.headers(), "Content-Type": "application/json"}
    response = system.http.post("/v1/turns", content=body, headers=headers)
    # Then it is accepted and runs
    assert response.status_code == 202, response.text
    assert system.wait_turn(response.json()["turn_id"])["status"] == "completed"


# --- 409 -------------------------------------------------------------------------------------------


def test_follow_up_is_409_session_busy_while_a_turn_runs_and_accepted_after(system: System, engine: Engine) -> None:
    # Given a session whose follow-up turn is still running
    first = system.run_turn({"input": f"base {_marker()}"})
    session_id = first["session_id"]
    slow = system.post_turn({"session_id": session_id, "input": f"slow [[sleep:3000]] {_marker()}"})
    assert slow.status_code == 202, slow.text
    counts_while_busy = _turns_in_session(engine, session_id)
    # When another follow-up is posted to the same session
    busy = system.post_turn({"session_id": session_id, "input": f"too soon {_marker()}"})
    busy_waiting = system.post_turn({"session_id": session_id, "input": f"too soon {_marker()}"}, wait=5)
    # Then it is 409 session_busy and recorded nothing
    _assert_error(busy, 409, "session_busy")
    _assert_error(busy_waiting, 409, "session_busy")
    assert _turns_in_session(engine, session_id) == counts_while_busy == 2
    # And once the running turn completed, a follow-up is accepted
    assert system.wait_turn(slow.json()["turn_id"])["status"] == "completed"
    after = system.run_turn({"session_id": session_id, "input": f"now {_marker()}"})
    assert after["status"] == "completed"
    assert _turns_in_session(engine, session_id) == 3


def _turns_in_session(engine: Engine, session_id: str) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(TurnRow).where(TurnRow.session_id == session_id)) or 0)


# --- idempotency -----------------------------------------------------------------------------------


def test_same_idempotency_key_and_body_returns_the_same_turn_when_posted_twice(system: System, engine: Engine) -> None:
    # Given a request with an idempotency key
    key = f"idem-{uuid.uuid4().hex}"
    body = {"input": f"once {_marker()}", "idempotency_key": key, "metadata": {"a": "1", "b": "2"}}
    # When it is posted twice (the second time with its metadata keys in another order)
    first = system.post_turn(body)
    second = system.post_turn({**body, "metadata": {"b": "2", "a": "1"}})
    # Then both are 202 with the same turn and session, and only one turn exists
    assert first.status_code == 202, first.text
    assert second.status_code == 202, second.text
    assert second.json()["turn_id"] == first.json()["turn_id"]
    assert second.json()["session_id"] == first.json()["session_id"]
    with engine.connect() as conn:
        count = conn.scalar(select(func.count()).select_from(TurnRow).where(TurnRow.idempotency_key == key))
    assert count == 1
    assert system.wait_turn(first.json()["turn_id"])["status"] == "completed"


def test_same_idempotency_key_with_another_body_is_409_when_posted_again(system: System, engine: Engine) -> None:
    # Given a turn posted with an idempotency key
    key = f"idem-{uuid.uuid4().hex}"
    first = system.post_turn({"input": f"original {_marker()}", "idempotency_key": key})
    assert first.status_code == 202, first.text
    before = _counts(engine, ORG_A)
    # When the same key comes with a different body
    reused = system.post_turn({"input": f"different {_marker()}", "idempotency_key": key})
    # Then it is 409 and nothing new was recorded
    _assert_error(reused, 409, "idempotency_key_reused")
    assert _counts(engine, ORG_A) == before
    assert system.wait_turn(first.json()["turn_id"])["status"] == "completed"


def test_idempotency_key_is_scoped_to_the_org_when_two_orgs_use_the_same_key(system: System) -> None:
    key = f"idem-{uuid.uuid4().hex}"
    body = {"input": f"shared key {_marker()}", "idempotency_key": key}
    for_a = system.post_turn(body, key=KEY_A)
    for_b = system.post_turn(body, key=KEY_B)
    assert for_a.status_code == for_b.status_code == 202
    assert for_a.json()["turn_id"] != for_b.json()["turn_id"]
    assert system.wait_turn(for_a.json()["turn_id"], key=KEY_A)["status"] == "completed"
    assert system.wait_turn(for_b.json()["turn_id"], key=KEY_B)["status"] == "completed"


# --- wait and handles ------------------------------------------------------------------------------


def test_post_turn_answers_a_202_turn_handle_when_not_waiting(system: System) -> None:
    response = system.post_turn({"input": f"handle {_marker()}"})
    assert response.status_code == 202, response.text
    handle = response.json()
    assert set(handle) == {"turn_id", "session_id", "status"}
    assert handle["status"] == "queued"
    assert handle["turn_id"].startswith("turn_") and handle["session_id"].startswith("sess_")
    assert system.wait_turn(handle["turn_id"])["status"] == "completed"


def test_post_turn_answers_a_200_turn_when_waiting_for_it_to_finish(system: System) -> None:
    marker = _marker()
    response = system.post_turn({"input": f"wait {marker}"}, wait=30)
    assert response.status_code == 200, response.text
    turn = response.json()
    assert turn["status"] == "completed"
    assert turn["output_text"] == f"Echo: wait {marker}"
    assert {"turn_id", "session_id", "batch_id", "mode", "mode_changes", "pending_tool_calls", "error", "usage"} <= set(
        turn
    )
    assert system.http.get(f"/v1/turns/{turn['turn_id']}", headers=system.headers()).json() == turn


def test_post_turn_answers_202_when_wait_is_zero(system: System) -> None:
    response = system.post_turn({"input": f"zero {_marker()}"}, wait=0)
    assert response.status_code == 202, response.text
    assert system.wait_turn(response.json()["turn_id"])["status"] == "completed"


# --- health and OpenAPI ----------------------------------------------------------------------------


def test_healthz_is_200_when_the_gateway_runs(system: System) -> None:
    response = system.http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_200_with_every_check_ok_when_the_dependencies_answer(system: System) -> None:
    response = system.http.get("/readyz")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ready"
    assert body["checks"] == {"database": "ok", "schema": "ok", "redis": "ok", "broker": "ok", "api_keys": "ok"}
    assert body["schema"] == {"revision": head_revision(), "required": head_revision()}


def test_readyz_is_503_saying_to_migrate_when_the_schema_is_behind(
    system: System, extra_gateway: Callable[[dict[str, str]], str], tmp_path: Path
) -> None:
    # Given a gateway on a database nobody migrated
    database = f"sqlite:///{tmp_path}/never-migrated.sqlite"
    url = extra_gateway({"APTIX_DATABASE_URL": database})
    # When its readiness is asked
    ready = system.http.get(f"{url}/readyz", timeout=60)
    # Then it is not ready, and says what to run
    assert ready.status_code == 503, ready.text
    error = ready.json()["error"]
    assert error["details"] == {"database": "ok", "schema": "down", "redis": "ok", "broker": "ok", "api_keys": "ok"}
    assert "aptix db upgrade" in error["message"] and "revision None" in error["message"]
    # And a turn posted to it is a 503 that says the same, not a 500
    posted = system.http.post(f"{url}/v1/turns", json={"input": "hi"}, headers=system.headers(), timeout=60)
    assert posted.status_code == 503, posted.text
    assert "aptix db upgrade" in posted.json()["error"]["message"]
    # And once the schema is migrated it is ready, with no restart
    upgrade(database)
    ready = system.http.get(f"{url}/readyz", timeout=60)
    assert ready.status_code == 200, ready.text
    assert ready.json()["schema"]["revision"] == head_revision()


def test_readyz_is_503_naming_the_setting_when_no_api_key_is_configured(
    system: System, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    # Given a gateway started with no API keys (it would answer every request 401)
    url = extra_gateway({"APTIX_API_KEYS": ""})
    # When its readiness is asked
    ready = system.http.get(f"{url}/readyz", timeout=60)
    # Then it is not ready, and says which setting to set
    assert ready.status_code == 503, ready.text
    error = ready.json()["error"]
    assert error["details"]["api_keys"] == "down" and error["details"]["database"] == "ok"
    assert "APTIX_API_KEYS" in error["message"]


def test_openapi_document_is_served_with_the_turns_path(system: System) -> None:
    response = system.http.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/v1/turns" in paths and "post" in paths["/v1/turns"]
    assert "/v1/turns/{turn_id}" in paths
    assert "/v1/sessions/{session_id}" in paths
    assert "/v1/modes" in paths


def test_modes_lists_the_catalog_when_authenticated(system: System) -> None:
    response = system.http.get("/v1/modes", headers=system.headers())
    assert response.status_code == 200
    names = [mode["name"] for mode in response.json()["modes"]]
    assert "general" in names


# --- no 500 for bad input --------------------------------------------------------------------------

_JSON = {"Content-Type": "application/json"}
_LINES = {"headers": {"Content-Type": "application/jsonl"}}
_HOSTILE: dict[str, tuple[str, str, dict[str, Any]]] = {
    "input null": ("POST", "/v1/turns", {"json": {"input": None}}),
    "input true": ("POST", "/v1/turns", {"json": {"input": True}}),
    "input object": ("POST", "/v1/turns", {"json": {"input": {"text": "hi"}}}),
    "input huge float": ("POST", "/v1/turns", {"json": {"input": 1e308}}),
    "input NaN literal": ("POST", "/v1/turns", {"content": b'{"input": NaN}', "headers": _JSON}),
    "input Infinity literal": ("POST", "/v1/turns", {"content": b'{"input": -Infinity}', "headers": _JSON}),
    "input 1e999": ("POST", "/v1/turns", {"content": b'{"input": 1e999}', "headers": _JSON}),
    "input 5000-digit integer": (
        "POST",
        "/v1/turns",
        {"content": b'{"input": 1' + b"0" * 5000 + b"}", "headers": _JSON},
    ),
    "session_id integer": ("POST", "/v1/turns", {"json": {"input": "hi", "session_id": 2**70}}),
    "session_id list": ("POST", "/v1/turns", {"json": {"input": "hi", "session_id": ["sess_x"]}}),
    "session_id too long": ("POST", "/v1/turns", {"json": {"input": "hi", "session_id": "s" * 129}}),
    "session_id with nul": ("POST", "/v1/turns", {"json": {"input": "hi", "session_id": "sess_\x00"}}),
    "mode object": ("POST", "/v1/turns", {"json": {"input": "hi", "mode": {"name": "general"}}}),
    "tools string": ("POST", "/v1/turns", {"json": {"input": "hi", "tools": "open_file"}}),
    "tools object": ("POST", "/v1/turns", {"json": {"input": "hi", "tools": {"name": "t"}}}),
    "tools of numbers": ("POST", "/v1/turns", {"json": {"input": "hi", "tools": [1, 2, 3]}}),
    "tool parameters string": (
        "POST",
        "/v1/turns",
        {"json": {"input": "hi", "tools": [{"name": "t", "parameters": "x"}]}},
    ),
    "tool parameters type list": (
        "POST",
        "/v1/turns",
        {"json": {"input": "hi", "tools": [{"name": "t", "parameters": {"type": ["object"]}}]}},
    ),
    "tool strict string": ("POST", "/v1/turns", {"json": {"input": "hi", "tools": [{"name": "t", "strict": "maybe"}]}}),
    "tool extra field": ("POST", "/v1/turns", {"json": {"input": "hi", "tools": [{"name": "t", "x": 1}]}}),
    "too many tools": (
        "POST",
        "/v1/turns",
        {"json": {"input": "hi", "tools": [{"name": f"t{i}"} for i in range(129)]}},
    ),
    "metadata too many keys": (
        "POST",
        "/v1/turns",
        {"json": {"input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}},
    ),
    "metadata empty key": ("POST", "/v1/turns", {"json": {"input": "hi", "metadata": {"": "v"}}}),
    "metadata long value": ("POST", "/v1/turns", {"json": {"input": "hi", "metadata": {"k": "v" * 513}}}),
    "metadata null value": ("POST", "/v1/turns", {"json": {"input": "hi", "metadata": {"k": None}}}),
    "idempotency_key number": ("POST", "/v1/turns", {"json": {"input": "hi", "idempotency_key": 7}}),
    "deeply nested array": (
        "POST",
        "/v1/turns",
        {"content": b'{"input": "hi", "metadata": ' + b"[" * 20000 + b"]" * 20000 + b"}", "headers": _JSON},
    ),
    "deeply nested tool parameters": (
        "POST",
        "/v1/turns",
        {
            "content": b'{"input": "hi", "tools": [{"name": "t", "parameters": '
            + b'{"a": ' * 5000
            + b"1"
            + b"}" * 5000
            + b"}]}",
            "headers": _JSON,
        },
    ),
    "invalid utf-8": ("POST", "/v1/turns", {"content": b'{"input": "\xc3\x28 \xff"}', "headers": _JSON}),
    "utf-16 body": ("POST", "/v1/turns", {"content": '{"input": 5}'.encode("utf-16"), "headers": _JSON}),
    "empty body": ("POST", "/v1/turns", {"content": b"", "headers": _JSON}),
    "whitespace body": ("POST", "/v1/turns", {"content": b"   \n", "headers": _JSON}),
    "truncated json": ("POST", "/v1/turns", {"content": b'{"input": "hi"', "headers": _JSON}),
    "text/plain body": ("POST", "/v1/turns", {"content": b"hello", "headers": {"Content-Type": "text/plain"}}),
    "form body": ("POST", "/v1/turns", {"data": {"input": "hi"}}),
    "multipart body": ("POST", "/v1/turns", {"files": {"input": ("a.txt", b"hi")}}),
    "json with charset latin-1": (
        "POST",
        "/v1/turns",
        {"content": b'{"input": 1}', "headers": {"Content-Type": "application/json; charset=latin-1"}},
    ),
    "unknown route": ("GET", "/v1/nope", {}),
    "unknown top-level route": ("POST", "/admin", {"json": {}}),
    "trace of unknown turn": ("GET", f"/v1/turns/{UNKNOWN_TURN_ID}/trace/extra", {}),
    "GET on the turns collection": ("GET", "/v1/turns", {}),
    "DELETE a turn": ("DELETE", f"/v1/turns/{UNKNOWN_TURN_ID}", {}),
    "PUT a session": ("PUT", f"/v1/sessions/{UNKNOWN_SESSION_ID}", {"json": {}}),
    "POST the modes": ("POST", "/v1/modes", {"json": {}}),
    "PATCH healthz": ("PATCH", "/healthz", {}),
    "GET turn with a huge wait": ("GET", f"/v1/turns/{UNKNOWN_TURN_ID}?wait=1e400", {}),
    "GET turn with a repeated wait": ("GET", f"/v1/turns/{UNKNOWN_TURN_ID}?wait=1&wait=x", {}),
    "batch body nested 1,000 deep": (
        "POST",
        "/v1/batches",
        {"content": b'{"requests": ' + b"[" * 1000 + b"]" * 1000 + b"}", "headers": _JSON},
    ),
    "batch upload line nested 1,000 deep": (
        "POST",
        "/v1/batches",
        {"content": b'{"input": "hi"}\n{"input": "hi", "metadata": ' + b"[" * 1000 + b"]" * 1000 + b"}\n", **_LINES},
    ),
    "list batches after with nul": ("GET", "/v1/batches?after=a%00b", {}),
    "upload with nul in idempotency_key": (
        "POST",
        "/v1/batches?idempotency_key=k%00k",
        {"content": b'{"input": "hi"}\n', **_LINES},
    ),
    "upload with nul in webhook_url": (
        "POST",
        "/v1/batches?webhook_url=https%3A%2F%2Fexample.com%2F%00",
        {"content": b'{"input": "hi"}\n', **_LINES},
    ),
    "webhook deliveries with nul in batch_id": ("GET", "/v1/webhook-deliveries?batch_id=batch_%00", {}),
}


@pytest.mark.parametrize(("method", "path", "request_kwargs"), list(_HOSTILE.values()), ids=list(_HOSTILE))
def test_hostile_request_is_a_4xx_with_the_error_body_when_sent(
    system: System, engine: Engine, method: str, path: str, request_kwargs: dict[str, Any]
) -> None:
    # Given a hostile request with a valid key
    before = _counts(engine, ORG_A)
    kwargs = dict(request_kwargs)
    headers = {**system.headers(), **kwargs.pop("headers", {})}
    # When it is sent
    response = system.http.request(method, path, headers=headers, **kwargs)
    # Then it is refused with a 4xx and the error body, and recorded nothing
    assert 400 <= response.status_code < 500, response.text
    _assert_error(response, response.status_code)
    if response.status_code == 405:
        assert response.headers.get("allow"), response.headers
    assert _counts(engine, ORG_A) == before


def test_metrics_count_requests_by_route_template_and_accepted_turns(system: System) -> None:
    turn = system.run_turn({"input": "metrics"})
    assert system.http.get(f"/v1/turns/{turn['turn_id']}", headers=system.headers()).status_code == 200
    body = system.http.get("/metrics").text
    assert 'aptix_http_requests_total{method="POST",route="/v1/turns",status="200"}' in body
    assert 'route="/v1/turns/{turn_id}"' in body
    assert 'aptix_turns_accepted_total{kind="single"}' in body
    assert not re.search(r"(turn|sess)_[0-9a-f]{32}", body), "raw ids leaked into metric labels"


def test_responses_carry_security_headers_and_a_trailing_slash_is_never_redirected(system: System) -> None:
    # Given an authenticated read, an unauthenticated one, a 404 and an oversized body
    responses = [
        system.http.get("/v1/modes", headers=system.headers()),
        system.http.get("/v1/modes"),
        system.http.get(f"/v1/turns/turn_{'0' * 32}", headers=system.headers()),
        system.http.post("/v1/turns", content=b"x" * (5 * 1024 * 1024), headers=system.headers()),
    ]
    # Then each carries the protective headers, and none may be cached
    assert [r.status_code for r in responses] == [200, 401, 404, 413]
    for response in responses:
        assert response.headers["x-content-type-options"] == "nosniff", response.headers
        assert response.headers["cache-control"] == "no-store", response.headers
        assert response.headers["x-frame-options"] == "DENY"
    # And a trailing slash is a 404, not a redirect built from a Host header the client chose
    slash = system.http.post("/v1/turns/", json={"input": "x"}, headers={**system.headers(), "Host": "evil.example"})
    assert slash.status_code == 404, slash.headers
    assert "location" not in slash.headers


def test_metrics_show_each_queue_backlog_and_never_grow_a_label_per_unknown_method(system: System) -> None:
    # Given requests with methods the HTTP parser accepts but no route has (WebDAV's, a CDN's)
    for method in ("PROPFIND", "MKCOL", "PURGE", "LOCK", "SEARCH"):
        system.http.request(method, "/v1/turns")
    # When the metrics are scraped
    body = system.http.get("/metrics").text
    # Then every queue's backlog is there, waiting and in progress, and the unknown methods share one label
    for queue in ("pipeline", "llm", "tools"):
        for state in ("waiting", "in_progress"):
            assert re.search(rf'aptix_queue_depth\{{queue="{queue}",state="{state}"\}} \d', body), (queue, state)
    assert not re.search(r'method="(PROPFIND|MKCOL|PURGE|LOCK|SEARCH)"', body)
    assert re.search(r'aptix_http_requests_total\{method="other",route="/v1/turns",status="405"\} 5', body)


def test_turn_is_503_and_not_recorded_when_the_broker_is_down_and_a_batch_is_held_for_admission(
    system: System, extra_gateway: Callable[[dict[str, str]], str], engine: Engine
) -> None:
    # Given a gateway whose broker does not answer
    from aptix_cli.launcher import free_port

    url = extra_gateway({"APTIX_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"})
    with engine.connect() as conn:
        before = conn.scalar(select(func.count()).select_from(TurnRow))
    # When a turn is posted
    turn = system.http.post(f"{url}/v1/turns", json={"input": "lost?"}, headers=system.headers(), timeout=60)
    ready = system.http.get(f"{url}/readyz", timeout=60)
    # Then it is refused with 503, and no turn was left behind without a message
    assert turn.status_code == 503 and turn.json()["error"]["code"] == "unavailable"
    assert ready.status_code == 503 and ready.json()["error"]["details"]["broker"] == "down"
    assert int(ready.headers["retry-after"]) > 0  # like every other 503: the body and headers come from one place
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(TurnRow)) == before
    # When a batch is posted to it: its turns are held in the state store for fair admission, no message
    # is sent by the gateway, so it is accepted; the admission scheduler sends them through its own broker
    batch = system.http.post(
        f"{url}/v1/batches", json={"requests": [{"input": "a"}, {"input": "b"}]}, headers=system.headers(), timeout=60
    )
    assert batch.status_code == 202, batch.text
    batch_url = f"{system.gateway_url}/v1/batches/{batch.json()['batch_id']}"

    def completed() -> dict[str, Any] | None:
        found: dict[str, Any] = system.http.get(batch_url, headers=system.headers()).json()
        return found if found["counts"]["completed"] == 2 else None

    assert wait_for(completed, what="the held batch to complete", seconds=60)["status"] == "completed"


def test_requests_are_503_with_retry_after_when_the_database_is_down(
    system: System, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    # Given a gateway whose database does not answer (nothing listens on its port)
    from aptix_cli.launcher import free_port

    url = extra_gateway({"APTIX_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"})
    # When a client posts a turn, reads one, and asks for a session
    responses = [
        system.http.post(f"{url}/v1/turns", json={"input": "db down"}, headers=system.headers(), timeout=60),
        system.http.get(f"{url}/v1/turns/turn_{'0' * 32}", headers=system.headers(), timeout=60),
        system.http.get(f"{url}/v1/sessions/sess_{'0' * 32}", headers=system.headers(), timeout=60),
    ]
    # Then each is a 503 `unavailable` that says when to retry, never a 500
    for response in responses:
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "unavailable"
        assert int(response.headers["retry-after"]) > 0


def test_turn_is_503_with_retry_after_when_the_state_store_is_down(
    system: System, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    from aptix_cli.launcher import free_port

    url = extra_gateway({"APTIX_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    response = system.http.post(f"{url}/v1/turns", json={"input": "redis down"}, headers=system.headers(), timeout=60)
    assert response.status_code == 503 and response.json()["error"]["code"] == "unavailable"
    assert "retry-after" in response.headers
