"""The CLI's side of turn events: parsing ``text/event-stream``, resuming a cut stream with Last-Event-ID,
and the one-line rendering of ``aptix watch``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from aptix_cli.client import ApiClient, GatewayError
from aptix_cli.rendering import event_line
from aptix_cli.sse import ServerEvent, parse_events

TURN_ID = "turn_" + "1" * 32


def test_parse_events_reads_ids_names_and_json_data_and_skips_comments() -> None:
    lines = [": keep-alive", "", "id: 1-0", "event: trace", 'data: {"seq": 1}', "", "data: plain", "", "id: 2-0"]
    assert list(parse_events(lines)) == [ServerEvent("1-0", "trace", {"seq": 1}), ServerEvent(None, "message", "plain")]


class _CutAfter(httpx.SyncByteStream):
    """A body that sends ``body`` and then breaks, as a dropped connection does."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        yield self.body
        raise httpx.ReadError("connection reset by peer")


def _frame(event_id: str, event: str, data: str) -> bytes:
    return f"id: {event_id}\nevent: {event}\ndata: {data}\n\n".encode()


def test_a_cut_stream_is_resumed_with_the_last_event_id_and_nothing_is_repeated() -> None:
    # Given a gateway whose first stream breaks after two events
    requests: list[httpx.Request] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if len(requests) == 1:
            body = _frame("1-0", "trace", '{"seq":1}') + _frame("2-0", "trace", '{"seq":2}')
            return httpx.Response(200, headers={"Aptix-Turn-Id": TURN_ID}, stream=_CutAfter(body))
        return httpx.Response(200, content=_frame("3-0", "turn.completed", '{"status":"completed"}'))

    # When a streamed turn is read to its end
    with ApiClient("http://gateway", key="k", transport=httpx.MockTransport(gateway)) as api:
        events = list(api.stream_turn({"input": "hi"}))

    # Then the second request resumed the turn's events after the last one received
    assert [event.event_id for event in events] == ["1-0", "2-0", "3-0"]
    first, second = requests
    assert (first.method, first.url.path, first.url.params.get("stream")) == ("POST", "/v1/turns", "true")
    assert (second.method, second.url.path) == ("GET", f"/v1/turns/{TURN_ID}/events")
    assert second.headers["last-event-id"] == "2-0"


def test_a_refused_stream_raises_the_gateways_error() -> None:
    def gateway(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"code": "unavailable", "message": "too many", "details": None}})

    with (
        ApiClient("http://gateway", key="k", transport=httpx.MockTransport(gateway)) as api,
        pytest.raises(GatewayError) as refused,
    ):
        list(api.turn_events(TURN_ID))
    assert (refused.value.status, refused.value.code) == (503, "unavailable")


def test_event_lines_show_what_each_event_says() -> None:
    trace = {"seq": 3, "kind": "llm_call", "step": "llm_call", "worker": "w1", "duration_ms": 12.5,
             "data": {"round": 0, "iteration": 1, "model": "m"}}  # fmt: skip
    assert event_line("5-0", "trace", trace) == "5-0  trace  #3 llm_call llm_call@w1 12.5ms model=m"
    assert event_line("6-0", "output_text.delta", {"delta": "Hel"}) == '6-0  output_text.delta  "Hel"'
    paused = {"status": "requires_client_tools", "pending_tool_calls": [{"call_id": "c1", "name": "open_file"}]}
    assert event_line("7-0", "turn.requires_client_tools", paused).endswith("pending=c1:open_file")
    failed = {"status": "failed", "error": {"code": "llm_error", "message": "down"}}
    assert event_line("8-0", "turn.failed", failed) == "8-0  turn.failed  status=failed error=llm_error: down"
