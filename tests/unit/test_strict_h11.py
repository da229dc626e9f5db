"""StrictConnection: h11's server side, refusing heads over the limit however they arrive, bare LFs, TE with CL.

Pure h11 state machine: bytes in, events or refusals out (the answers on a real gateway:
tests/integration/test_gateway_protocol.py).
"""

from __future__ import annotations

import h11
import pytest

from api_gateway.strict_h11 import HeadTooLarge, StrictConnection

LIMIT = 256


def _head(size: int) -> bytes:
    start, end = b"GET / HTTP/1.1\r\nHost: a\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"p" * (size - len(start) - len(end)) + end


def _events(conn: StrictConnection) -> list[object]:
    events: list[object] = []
    while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
        events.append(event)
    return events


def _answer(conn: StrictConnection) -> None:
    conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())


def test_a_head_at_the_limit_is_a_request() -> None:
    conn = StrictConnection(LIMIT)
    conn.receive_data(_head(LIMIT))
    events = _events(conn)
    assert isinstance(events[0], h11.Request) and isinstance(events[1], h11.EndOfMessage)


def test_a_head_over_the_limit_is_refused_when_it_arrives_at_once() -> None:
    conn = StrictConnection(LIMIT)
    conn.receive_data(_head(LIMIT + 1))
    with pytest.raises(HeadTooLarge) as refused:
        conn.next_event()
    assert refused.value.error_status_hint == 431
    assert conn.refusal is refused.value


def test_a_head_over_the_limit_is_refused_as_it_arrives_a_byte_at_a_time() -> None:
    conn = StrictConnection(LIMIT)
    head = _head(LIMIT * 2)
    for n in range(LIMIT):
        conn.receive_data(head[n : n + 1])
        assert conn.next_event() is h11.NEED_DATA
    conn.receive_data(head[LIMIT : LIMIT + 1])
    with pytest.raises(HeadTooLarge):
        conn.next_event()


@pytest.mark.parametrize(
    "head",
    [b"GET / HTTP/1.1\nHost: a\n\n", b"GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n", b"GET / HTTP/1.1\r\nHost: a\r\n\n"],
    ids=["every-line", "one-header", "the-empty-line"],
)
def test_a_head_with_a_bare_lf_is_refused(head: bytes) -> None:
    conn = StrictConnection(LIMIT)
    conn.receive_data(head)
    with pytest.raises(h11.RemoteProtocolError, match="bare LF") as refused:
        conn.next_event()
    assert refused.value.error_status_hint == 400


def test_a_bare_lf_in_the_body_is_the_body() -> None:
    conn = StrictConnection(LIMIT)
    conn.receive_data(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\na\nb\n")
    events = _events(conn)
    assert [type(event) for event in events] == [h11.Request, h11.Data, h11.EndOfMessage]


def test_a_request_with_both_transfer_encoding_and_content_length_is_refused() -> None:
    conn = StrictConnection(LIMIT)
    conn.receive_data(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n")
    with pytest.raises(h11.RemoteProtocolError, match="Transfer-Encoding and Content-Length"):
        conn.next_event()
    # And nothing more is read from it
    with pytest.raises(h11.RemoteProtocolError):
        conn.next_event()


def test_a_chunked_request_is_a_request() -> None:
    conn = StrictConnection(LIMIT)
    conn.receive_data(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n")
    assert [type(event) for event in _events(conn)] == [h11.Request, h11.Data, h11.EndOfMessage]


def test_a_pipelined_head_is_checked_when_its_cycle_starts() -> None:
    # Given a good request with a bare-LF one right behind it, in one read
    conn = StrictConnection(LIMIT)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\nHost: a\n\n")
    assert [type(event) for event in _events(conn)] == [h11.Request, h11.EndOfMessage]
    # When the first is answered and the next cycle starts
    _answer(conn)
    conn.start_next_cycle()
    # Then the second is refused
    with pytest.raises(h11.RemoteProtocolError, match="bare LF"):
        conn.next_event()


def test_a_kept_alive_connection_checks_each_head_it_receives() -> None:
    conn = StrictConnection(LIMIT)
    conn.receive_data(_head(LIMIT))
    assert isinstance(_events(conn)[0], h11.Request)
    _answer(conn)
    conn.start_next_cycle()
    conn.receive_data(_head(LIMIT)[:100])
    assert conn.next_event() is h11.NEED_DATA
    conn.receive_data(_head(LIMIT + 1)[100:])
    with pytest.raises(HeadTooLarge):
        conn.next_event()


def _post(declared: int, sent: bytes) -> bytes:
    return f"POST /v1/batches HTTP/1.1\r\nHost: a\r\nContent-Length: {declared}\r\n\r\n".encode() + sent


def test_an_answer_begun_while_the_body_is_owed_says_connection_close_but_h11_keeps_the_connection() -> None:
    # Given a request whose body has not all arrived
    conn = StrictConnection(LIMIT)
    conn.receive_data(_post(10, b"12345"))
    _events(conn)
    # When the app answers it (a refusal: it did not read the body)
    head = conn.send(h11.Response(status_code=401, headers=[("Content-Length", "0")]))
    # Then the client is told not to send its next request on this connection
    assert head is not None and head.endswith(b"\r\nconnection: close\r\n\r\n"), head
    assert head.lower().count(b"connection:") == 1
    # And h11 itself was not told: the server drains the rest of the body before it closes the connection
    conn.send(h11.EndOfMessage())
    assert conn.our_state is h11.DONE


def test_an_answer_to_a_request_whose_body_arrived_keeps_the_connection() -> None:
    conn = StrictConnection(LIMIT)
    conn.receive_data(_post(5, b"12345"))
    _events(conn)
    head = conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
    assert head is not None and b"connection" not in head.lower(), head


def test_an_answer_that_names_its_own_connection_header_is_sent_as_it_is() -> None:
    conn = StrictConnection(LIMIT)
    conn.receive_data(_post(10, b"1"))
    _events(conn)
    head = conn.send(h11.Response(status_code=413, headers=[("Content-Length", "0"), ("Connection", "close")]))
    assert head is not None and head.lower().count(b"connection: close") == 1, head
