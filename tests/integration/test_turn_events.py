"""Turn events over Server-Sent Events on the real gateway and worker processes and a real Redis.

A streamed turn's events arrive in order with ids; its stream ends at the pause and again at the end;
a reconnection with ``Last-Event-ID`` gets exactly the rest; a second gateway process serves the same
turn's stream; another organisation's turn is a 404; a cancel ends the stream; a turn whose log lost
its final event still ends every stream; a process serves at most ``APTIX_EVENTS_MAX_STREAMS``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, update

from shared.db.tables import TurnRow
from shared.state.keys import events_key
from tests.conftest import KEY_A, KEY_B
from tests.integration.conftest import OPEN_FILE, System
from tests.support.sse import SseEvent, SseRead, iter_sse, read_sse
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

SECOND_GATEWAY_STREAMS = 2


@pytest.fixture(scope="module")
def second_gateway(system: System) -> Iterator[str]:
    """Another gateway process on the same services: quick keep-alives, at most two streams."""
    process, url = system.stack.start_gateway(
        env={"APTIX_EVENTS_KEEPALIVE_SECONDS": "0.2", "APTIX_EVENTS_MAX_STREAMS": str(SECOND_GATEWAY_STREAMS)}
    )
    yield url
    system.stack.stop([process])


def _marker() -> str:
    return uuid.uuid4().hex[:10]


@contextmanager
def _stream(
    system: System, method: str, path: str, *, base_url: str | None = None, key: str = KEY_A, **kwargs: Any
) -> Iterator[httpx.Response]:
    headers = {**system.headers(key), **kwargs.pop("headers", {})}
    with (
        httpx.Client(base_url=base_url or system.gateway_url, timeout=60.0) as client,
        client.stream(method, path, headers=headers, **kwargs) as response,
    ):
        yield response


def _events(system: System, turn_id: str, *, base_url: str | None = None, **kwargs: Any) -> SseRead:
    with _stream(system, "GET", f"/v1/turns/{turn_id}/events", base_url=base_url, **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return read_sse(response)


def _get(system: System, turn_id: str) -> dict[str, Any]:
    response = system.http.get(f"/v1/turns/{turn_id}", headers=system.headers())
    assert response.status_code == 200, response.text
    turn: dict[str, Any] = response.json()
    return turn


def _order(event_id: str | None) -> tuple[int, int]:
    assert event_id is not None
    millis, _, sequence = event_id.partition("-")
    return int(millis), int(sequence)


def _assert_well_formed(events: list[SseEvent]) -> None:
    """Every event has an id, ids increase, and trace records come once each, in ``seq`` order."""
    assert all(event.event_id for event in events)
    ids = [_order(event.event_id) for event in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    seqs = [event.data["seq"] for event in events if event.event == "trace"]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True


def test_a_streamed_turn_with_a_server_tool_and_a_client_pause_streams_each_round_in_order(system: System) -> None:
    # Given a turn whose model calls a server tool and a client tool, asked to stream
    text = f'{_marker()} [[call:record_call {{"key": "{_marker()}"}}]] [[call:open_file {{"path": "a.txt"}}]]'
    body = {"input": text, "tools": [OPEN_FILE]}
    # When it is posted with ?stream=true
    with _stream(system, "POST", "/v1/turns", params={"stream": "true"}, json=body) as response:
        assert response.status_code == 200, response.read()
        first = read_sse(response)
        turn_id = response.headers["aptix-turn-id"]
    # Then its events arrive in order and the stream ends at the pause, with the pending call
    _assert_well_formed(first.events)
    pause = first.events[-1]
    assert pause.data["turn_id"] == turn_id
    assert pause.event == "turn.requires_client_tools"
    assert pause.data == _get(system, turn_id)
    assert [call["name"] for call in pause.data["pending_tool_calls"]] == ["open_file"]
    kinds = [event.data["kind"] for event in first.events if event.event == "trace"]
    assert kinds[0] == "turn_start" and "llm_call" in kinds and "tool_execution" in kinds and kinds[-1] == "committed"
    assert [event.event for event in first.events[:-1]] == ["trace"] * (len(first.events) - 1)

    # And a client that already has the pause and reconnects gets nothing more in this round, at once
    assert _events(system, turn_id, headers={"Last-Event-ID": pause.event_id}).events == []

    # When the client posts its results with ?stream=true
    call_id = pause.data["pending_tool_calls"][0]["call_id"]
    results = {"tool_results": [{"call_id": call_id, "output": "file text"}]}
    with _stream(system, "POST", f"/v1/turns/{turn_id}/tool-results", params={"stream": "true"}, json=results) as r:
        assert r.status_code == 200, r.read()
        second = read_sse(r)
    # Then the new round streams from where the pause left off and ends completed, as GET shows it
    _assert_well_formed(first.events + second.events)
    final = second.events[-1]
    turn = _get(system, turn_id)
    assert (final.event, final.data) == ("turn.completed", turn)
    assert "file text" in turn["output_text"]
    streamed = [event.data for event in first.events + second.events if event.event == "trace"]
    assert streamed == system.trace(turn_id)
    deltas = "".join(e.data["delta"] for e in second.events if e.event == "output_text.delta")
    assert deltas in ("", turn["output_text"])  # the model's text of the round's one call, when it was streamed

    # And a client that reads the turn's events afterwards gets all of them, ending at the final event
    replay = _events(system, turn_id)
    assert [(e.event_id, e.event, e.data) for e in replay.events] == [
        (e.event_id, e.event, e.data) for e in first.events + second.events
    ]
    assert _events(system, turn_id, headers={"Last-Event-ID": final.event_id}).events == []


def test_reconnecting_with_last_event_id_replays_exactly_the_events_missed(system: System) -> None:
    # Given a turn whose model takes a while, and a client that read its first events and went away
    response = system.post_turn({"input": f"{_marker()} [[sleep:1500]]"})
    turn_id = response.json()["turn_id"]
    with _stream(system, "GET", f"/v1/turns/{turn_id}/events") as first:
        seen = read_sse(first, stop_after=2).events
    assert len(seen) == 2
    # When it reconnects with the last id it saw (and another with ?after=)
    rest = _events(system, turn_id, headers={"Last-Event-ID": seen[-1].event_id})
    # Then it gets exactly the events after it: none twice, none lost, up to the final one
    everything = _events(system, turn_id).events
    assert [e.event_id for e in seen + rest.events] == [e.event_id for e in everything]
    assert rest.events[-1].event == "turn.completed"
    after = _events(system, turn_id, params={"after": everything[3].event_id}).events
    assert [e.event_id for e in after] == [e.event_id for e in everything[4:]]
    # A header and the query both given: the header (what EventSource sends on reconnection) wins
    both = _events(
        system, turn_id, params={"after": everything[1].event_id}, headers={"Last-Event-ID": everything[2].event_id}
    )
    assert [e.event_id for e in both.events] == [e.event_id for e in everything[3:]]


def test_another_gateway_process_streams_the_same_turn_live_with_keep_alives(
    system: System, second_gateway: str
) -> None:
    # Given a slow turn started on the first gateway and followed there
    response = system.post_turn({"input": f"{_marker()} [[sleep:1500]]"})
    turn_id = response.json()["turn_id"]
    # When the second gateway streams it too, while it runs
    elsewhere = _events(system, turn_id, base_url=second_gateway)
    here = _events(system, turn_id)
    # Then both send the same events, and the idle second gateway kept the stream alive meanwhile
    assert [(e.event_id, e.event, e.data) for e in elsewhere.events] == [
        (e.event_id, e.event, e.data) for e in here.events
    ]
    assert elsewhere.events[-1].event == "turn.completed"
    assert "keep-alive" in elsewhere.comments


def test_another_orgs_turn_and_an_unknown_turn_are_404(system: System) -> None:
    turn_id = system.run_turn({"input": f"{_marker()} mine"})["turn_id"]
    for key, path in ((KEY_B, f"/v1/turns/{turn_id}/events"), (KEY_A, f"/v1/turns/turn_{'0' * 32}/events")):
        response = system.http.get(path, headers=system.headers(key))
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "not_found"


# Not a Redis stream id: words, three parts, a part beyond 2^64 - 1 (Redis: "Invalid stream ID"), a trailing newline.
_NOT_EVENT_IDS = ("yesterday", "1-2-3", "18446744073709551616-0", "1-18446744073709551616", "18446744073709551616",
                  "1732350000000-0\n")  # fmt: skip


def test_a_position_that_is_not_an_event_id_is_422(system: System) -> None:
    turn_id = system.run_turn({"input": f"{_marker()} mine"})["turn_id"]
    positions: list[tuple[dict[str, str], dict[str, str] | None]]
    positions = [({"Last-Event-ID": value}, None) for value in _NOT_EVENT_IDS if "\n" not in value]
    positions += [({}, {"after": value}) for value in _NOT_EVENT_IDS]
    positions += [({"Last-Event-ID": "0"}, {"after": "1-2-3"})]  # the header wins, but a bad after is still refused
    for headers, params in positions:
        response = system.http.get(
            f"/v1/turns/{turn_id}/events", headers={**system.headers(), **headers}, params=params
        )
        assert response.status_code == 422, (headers, params, response.text)
        assert response.json()["error"]["code"] == "invalid_request"
    # And the largest id Redis takes is a position like any other: after it, nothing yet
    largest = "18446744073709551615-18446744073709551615"
    response = system.http.get(f"/v1/turns/{turn_id}/events", headers={**system.headers(), "Last-Event-ID": largest})
    assert response.status_code == 200 and "event:" not in response.text, response.text


def test_a_cancel_on_the_gateway_ends_the_stream_with_turn_cancelled(system: System) -> None:
    # Given a slow turn being streamed, its model call under way (the entry's task makes it, and sends the
    # entry's trace records with the save after it)
    marker = _marker()
    body = {"input": f"[[sleep:3000]] {marker}"}
    with _stream(system, "POST", "/v1/turns", params={"stream": "true"}, json=body) as r:
        turn_id = r.headers["aptix-turn-id"]
        assert r.headers["aptix-session-id"].startswith("sess_")
        items = iter_sse(r)
        wait_for(lambda: system.llm_requests(marker), what="the turn's model call")
        # When the client cancels it
        cancelled = system.http.post(f"/v1/turns/{turn_id}/cancel", headers=system.headers())
        assert cancelled.status_code == 200, cancelled.text
        rest = [item for item in items if isinstance(item, SseEvent)]
    # Then the stream ends with turn.cancelled, the turn as GET shows it
    assert (rest[-1].event, rest[-1].data) == ("turn.cancelled", _get(system, turn_id))


def test_a_turn_whose_log_lost_its_final_event_still_ends_every_stream_with_it_once(
    system: System, second_gateway: str, engine: Engine
) -> None:
    # Given a completed turn whose event log Redis lost, recorded a while ago
    turn_id = system.run_turn({"input": f"{_marker()} lost"})["turn_id"]
    system.redis.delete(events_key(turn_id))
    with engine.begin() as conn:
        old = datetime.now(UTC) - timedelta(minutes=1)
        conn.execute(update(TurnRow).where(TurnRow.turn_id == turn_id).values(updated_at=old))
    # When clients stream it on both gateways
    here = _events(system, turn_id).events
    elsewhere = _events(system, turn_id, base_url=second_gateway).events
    # Then each stream ends with turn.completed, as GET shows it, appended once
    turn = _get(system, turn_id)
    assert [(e.event, e.data) for e in here] == [("turn.completed", turn)]
    assert [e.event_id for e in elsewhere] == [e.event_id for e in here]
    assert system.redis.xlen(events_key(turn_id)) == 1


def test_a_gateway_process_serves_at_most_its_event_streams(system: System, second_gateway: str) -> None:
    # Given a gateway process that serves two streams at most, both taken by slow turns
    turn_ids = [system.post_turn({"input": f"{_marker()} [[sleep:2500]]"}).json()["turn_id"] for _ in range(3)]
    with (
        _stream(system, "GET", f"/v1/turns/{turn_ids[0]}/events", base_url=second_gateway) as one,
        _stream(system, "GET", f"/v1/turns/{turn_ids[1]}/events", base_url=second_gateway) as two,
    ):
        assert (one.status_code, two.status_code) == (200, 200)
        # When a third is asked for
        refused = httpx.get(f"{second_gateway}/v1/turns/{turn_ids[2]}/events", headers=system.headers())
        # Then it is refused 503 with Retry-After, and the two streams carry on to their end
        assert refused.status_code == 503 and refused.headers["retry-after"], refused.text
        assert "APTIX_EVENTS_MAX_STREAMS" in refused.json()["error"]["message"]
        assert read_sse(one).events[-1].event == "turn.completed"
        assert read_sse(two).events[-1].event == "turn.completed"
    # And once they ended, the process serves a stream again
    wait_for(
        lambda: (
            httpx.get(f"{second_gateway}/v1/turns/{turn_ids[2]}/events", headers=system.headers()).status_code == 200
        ),
        what="the ended streams to give their places back",
    )


def test_a_turn_is_streamed_with_post_stream_true_recorded_and_a_wait_with_it_is_422(system: System) -> None:
    body = {"input": f"{_marker()} hello", "stream": True}
    with _stream(system, "POST", "/v1/turns", json=body) as response:
        assert response.status_code == 200, response.read()
        events = read_sse(response).events
    assert events[-1].event == "turn.completed"
    refused = system.http.post("/v1/turns", json=body, headers=system.headers(), params={"stream": "true", "wait": 5})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_request"
