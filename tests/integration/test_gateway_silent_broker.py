"""A broker that stops answering (its host cut off: packets dropped, no reset) is a prompt 503, never a hang.

Found by the network fault ``gateway_broker_cut`` (issue 25): with the gateway's host cut off from the
broker, ``POST /v1/turns`` waited as long as the client let it (a minute and more) instead of answering
``503`` with ``Retry-After``. A listening socket that never reads stands in for the cut-off broker here.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from aptix_cli.launcher import ProcessGroup, free_port
from tests.conftest import API_KEYS, KEY_A

pytestmark = pytest.mark.integration

CLIENT_TIMEOUT = 30.0
"""Far longer than the gateway's broker timeouts; a gateway that hangs runs into it."""


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """The URL of a "broker" that accepts connections (the kernel completes them) and never answers."""
    port = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        yield f"redis://127.0.0.1:{port}/0"


def test_a_gateway_whose_broker_does_not_answer_says_503_with_retry_after(
    database_url: str, redis_db_url: str, silent_broker: str
) -> None:
    # Given a gateway whose broker accepts connections and never answers
    group = ProcessGroup({
        "APTIX_DATABASE_URL": database_url, "APTIX_REDIS_URL": redis_db_url, "APTIX_BROKER_URL": silent_broker,
        "APTIX_API_KEYS": API_KEYS, "APTIX_LLM_LOCAL_ONLY": "1",
    })  # fmt: skip
    try:
        _, url = group.start_gateway()

        # When a client starts a turn
        answer = httpx.post(
            f"{url}/v1/turns",
            json={"input": "hello"},
            headers={"Authorization": f"Bearer {KEY_A}"},
            timeout=CLIENT_TIMEOUT,
        )
    finally:
        group.stop_all()

    # Then it is told at once to come back later, and nothing was recorded for it
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "2"
    assert answer.json()["error"]["code"] == "unavailable"
