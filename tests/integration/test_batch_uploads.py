"""JSON Lines uploads to ``POST /v1/batches``: streamed, line-numbered errors, all or nothing, their own limits."""

from __future__ import annotations

import json
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from shared.db.tables import BatchRow, TurnRow
from tests.conftest import KEY_A
from tests.integration.conftest import System
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

UNKNOWN_SESSION_ID = "sess_" + "0" * 32
GENEROUS = 30.0
"""Seconds a raw connection waits for the gateway before the test fails."""


def _rows(engine: Engine) -> tuple[int, int]:
    """(batches, turns) in the whole database."""
    with engine.connect() as conn:
        batches = conn.scalar(select(func.count()).select_from(BatchRow))
        turns = conn.scalar(select(func.count()).select_from(TurnRow))
    return int(batches or 0), int(turns or 0)


def _chunks(text: str, size: int = 4096) -> Iterator[bytes]:
    """The body as a stream of chunks (sent chunked, with no Content-Length)."""
    data = text.encode()
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _upload(
    url: str | httpx.Client,
    lines: list[str],
    *,
    headers: dict[str, str],
    content_type: str = "application/jsonl",
    **params: str,
) -> httpx.Response:
    text = "\n".join(lines) + "\n"
    client = url if isinstance(url, httpx.Client) else httpx.Client(base_url=url, timeout=120)
    try:
        return client.post(
            "/v1/batches",
            content=_chunks(text),
            headers={**headers, "Content-Type": content_type},
            params=params,
        )
    finally:
        if not isinstance(url, httpx.Client):
            client.close()


def _line(request: dict[str, Any]) -> str:
    return json.dumps(request)


def test_upload_runs_every_line_as_a_turn_in_order(system: System, engine: Engine) -> None:
    # Given 60 requests as JSON Lines, larger together than the gateway's APTIX_MAX_BODY_BYTES (64 KiB
    # here), with blank lines between some of them
    marker = uuid.uuid4().hex[:8]
    lines: list[str] = []
    for i in range(60):
        lines.append(_line({"input": f"up {i} {marker} " + "x" * 1200}))
        if i % 7 == 0:
            lines.append("")
    assert len("\n".join(lines)) > 65536
    # When they are uploaded, streamed, with a batch idempotency key as a query parameter
    key = uuid.uuid4().hex
    response = _upload(system.http, lines, headers=system.headers(), idempotency_key=key)
    # Then the batch holds 60 turns, which all complete, their results in line order
    assert response.status_code == 202, response.text
    batch = response.json()
    assert batch["total"] == 60
    wait_for(
        lambda: (
            system.http.get(f"/v1/batches/{batch['batch_id']}", headers=system.headers()).json()["status"]
            == "completed"
        ),
        what="the upload's turns to complete",
        seconds=180,
        interval=0.5,
    )
    results = system.http.get(f"/v1/batches/{batch['batch_id']}/results", headers=system.headers())
    outputs = [json.loads(line)["output_text"] for line in results.text.splitlines()]
    assert outputs == [f"Echo: up {i} {marker} " + "x" * 1200 for i in range(60)]
    # And the same upload again is the same batch, recording nothing
    before = _rows(engine)
    again = _upload(system.http, lines, headers=system.headers(), idempotency_key=key)
    assert again.status_code == 202 and again.json()["batch_id"] == batch["batch_id"]
    assert _rows(engine) == before


def test_ndjson_is_accepted_too(system: System) -> None:
    response = _upload(
        system.http, [_line({"input": "nd"})], headers=system.headers(), content_type="application/x-ndjson"
    )
    assert response.status_code == 202, response.text
    assert response.json()["total"] == 1


@pytest.mark.parametrize(
    ("bad", "loc", "words"),
    [
        ("{not json", ["line", 4], "not valid JSON"),
        (_line({"input": ""}), ["line", 4, "input"], "input"),
        (_line({"input": "a", "surprise": 1}), ["line", 4, "surprise"], "surprise"),
        (_line({"input": "a", "mode": "no-such-mode"}), ["line", 4, "mode"], "unknown mode"),
        ("[1, 2]", ["line", 4], "TurnRequest"),
    ],
)
def test_a_malformed_line_is_422_naming_it_and_nothing_is_recorded(
    system: System, engine: Engine, bad: str, loc: list[Any], words: str
) -> None:
    # Given an upload whose fourth line (after a blank third) is malformed, with good lines after it
    lines = [_line({"input": "one"}), _line({"input": "two"}), "", bad, _line({"input": "five"})]
    before = _rows(engine)
    # When it is uploaded
    response = _upload(system.http, lines, headers=system.headers())
    # Then it is refused with the line's number, and no batch or turn was recorded
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith("line 4: "), error["message"]
    assert error["details"][0]["loc"][: len(loc)] == loc
    if words != "TurnRequest":
        assert words in json.dumps(error)
    assert _rows(engine) == before


def test_a_line_naming_an_unknown_session_keeps_its_code_and_names_the_line(system: System, engine: Engine) -> None:
    before = _rows(engine)
    lines = [_line({"input": "fine"}), _line({"input": "follow", "session_id": UNKNOWN_SESSION_ID})]
    response = _upload(system.http, lines, headers=system.headers())
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "session_not_found"
    assert response.json()["error"]["message"].startswith("line 2: ")
    assert _rows(engine) == before


def test_an_upload_of_blank_lines_only_is_422(system: System) -> None:
    response = _upload(system.http, ["", "  ", ""], headers=system.headers())
    assert response.status_code == 422
    assert "no request" in response.json()["error"]["message"]


@pytest.fixture
def small_uploads(system: System, extra_gateway: Callable[[dict[str, str]], str]) -> str:
    """A gateway that takes uploads of at most 5 requests and 4,000 bytes."""
    return extra_gateway({"APTIX_MAX_UPLOAD_REQUESTS": "5", "APTIX_MAX_UPLOAD_BYTES": "4000"})


def test_more_lines_than_the_limit_is_422_naming_the_first_one_over(
    system: System, engine: Engine, small_uploads: str
) -> None:
    before = _rows(engine)
    lines = [_line({"input": f"n{i}"}) for i in range(3)] + [""] + [_line({"input": f"m{i}"}) for i in range(3)]
    response = _upload(small_uploads, lines, headers=system.headers())
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["message"].startswith("line 7: ") and "APTIX_MAX_UPLOAD_REQUESTS" in error["message"]
    assert error["details"][0]["loc"] == ["line", 7]
    assert _rows(engine) == before


def test_an_upload_over_the_byte_limit_is_413(system: System, engine: Engine, small_uploads: str) -> None:
    before = _rows(engine)
    lines = [_line({"input": "y" * 1500}) for _ in range(3)]
    response = _upload(small_uploads, lines, headers=system.headers())
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and "APTIX_MAX_UPLOAD_BYTES" in error["message"]
    # The same with a declared Content-Length: refused before the body is read
    declared = httpx.post(
        f"{small_uploads}/v1/batches",
        content=("\n".join(lines)).encode(),
        headers={**system.headers(), "Content-Type": "application/jsonl"},
    )
    assert declared.status_code == 413
    assert _rows(engine) == before


def _send_part_of_an_upload(
    url: str, part: bytes, *, declared: int, path: str = "/v1/batches", content_type: str = "application/jsonl"
) -> socket.socket:
    """A connection that sent an authenticated POST's head (declaring ``declared`` bytes of body) and ``part``."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=GENEROUS)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: aptix\r\nAuthorization: Bearer {KEY_A}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {declared}\r\n\r\n"
    )
    sock.sendall(head.encode() + part)
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the response on ``sock`` (its Content-Length of body)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"the gateway closed the connection without an answer: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    (length,) = [int(line[15:]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ")[1]), json.loads(body)


def test_a_line_longer_than_one_request_may_be_is_413_naming_it_before_the_rest_arrives(
    system: System, engine: Engine
) -> None:
    # Given an upload declaring 10 MiB whose second line grows past APTIX_MAX_BODY_BYTES (64 KiB here),
    # and whose sender then waits for an answer without sending the rest
    limit = int(system.env["APTIX_MAX_BODY_BYTES"])
    before = _rows(engine)
    part = _line({"input": "fine"}).encode() + b'\n{"input": "' + b"x" * (limit + 1000)
    with _send_part_of_an_upload(system.gateway_url, part, declared=10 * 1024 * 1024) as sock:
        # Then it is answered 413 at once, naming the line (the gateway read no more than that line allows)
        status, body = _answer(sock)
    assert status == 413, body
    error = body["error"]
    assert error["code"] == "request_too_large"
    assert error["message"].startswith("line 2: ") and "APTIX_MAX_BODY_BYTES" in error["message"], error
    assert error["details"] == [{"loc": ["line", 2], "msg": "line too long", "type": "too_long"}]
    assert _rows(engine) == before
    # And a line of exactly that many bytes is a request like any other
    exact = _line({"input": "y" * (limit - len(_line({"input": ""})))})
    assert len(exact.encode()) == limit
    response = _upload(system.http, [exact], headers=system.headers())
    assert response.status_code == 202, response.text


def test_a_client_that_goes_away_mid_upload_is_a_quiet_499_not_a_500(
    system: System, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    # Given a gateway of its own (its log holds only what this test does)
    url = extra_gateway({})
    gateway = system.stack.processes[-1]
    # When a client sends part of an upload, and part of a turn's body, then closes its connection
    part = _line({"input": "gone"}).encode() + b"\n"
    _send_part_of_an_upload(url, part, declared=50_000).close()
    _send_part_of_an_upload(url, part, declared=50_000, path="/v1/turns", content_type="application/json").close()
    wait_for(lambda: gateway.log().count(" 499 ") == 2, what="both requests' access lines", seconds=GENEROUS)
    # Then each request has one access line with 499 (the client closed its request), and no traceback
    log = gateway.log()
    assert re.search(r"POST /v1/batches 499 \d+\.\dms", log) and re.search(r"POST /v1/turns 499 \d+\.\dms", log), log
    assert "Traceback" not in log and "unhandled error" not in log and "ClientDisconnect" not in log, log
    # And the metrics count them as 499, never as a server error
    metrics = httpx.get(f"{url}/metrics").text
    assert 'aptix_http_requests_total{method="POST",route="/v1/batches",status="499"} 1.0' in metrics
    assert 'status="5' not in metrics, metrics
