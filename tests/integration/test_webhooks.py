"""Signed webhooks end to end: real gateway and worker processes, real Redis and PostgreSQL, and a
receiver in this process (on 127.0.0.1, so the system runs with APTIX_WEBHOOK_ALLOW_PRIVATE=1 and a
second gateway without it checks that private addresses are refused).

The system here is its own (its database, its Redis databases, its settings): webhook secrets and a
fast retry schedule must not leak into the other tests' system, nor theirs into this one.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert
from standardwebhooks.webhooks import Webhook

from scripted_llm import ScriptedServer
from shared.db import create_db_engine
from shared.db.tables import WebhookDeliveryRow
from tests.conftest import API_KEYS, KEY_A, KEY_B, ORG_A, redis_databases
from tests.integration.conftest import OPEN_FILE, System, system_env
from tests.support.databases import fresh_database
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import Received, WebhookReceiver

pytestmark = pytest.mark.integration

KEY_C, ORG_C = "test-key-c", "org-c"
KEY_D, ORG_D = "test-key-d", "org-d"
"""An organisation whose secrets live only in the database (``aptix webhooks secret``)."""
SECRET_A = "whsec_" + base64.b64encode(os.urandom(24)).decode()
SECRET_C = "whsec_" + base64.b64encode(os.urandom(32)).decode()
RETRIES = 3
"""Retries of the test schedule (``APTIX_WEBHOOK_RETRY_SCHEDULE``): four attempts in all, 0.2 s apart."""


class WebhookSystem:
    """The system, its receiver, a gateway that refuses private addresses, and its database."""

    def __init__(self, system: System, receiver: WebhookReceiver, strict_url: str, database_url: str) -> None:
        self.system = system
        self.receiver = receiver
        self.strict_url = strict_url
        self.database_url = database_url

    def deliveries(self, *, key: str = KEY_A, **query: str) -> dict[str, Any]:
        """GET /v1/webhook-deliveries."""
        response = self.system.http.get("/v1/webhook-deliveries", params=query, headers=self.system.headers(key))
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()
        return found

    def settled(self, *, key: str = KEY_A, count: int = 1, **query: str) -> list[dict[str, Any]]:
        """The deliveries for ``query`` once there are ``count`` and none is pending any more."""

        def done() -> list[dict[str, Any]] | None:
            found: list[dict[str, Any]] = self.deliveries(key=key, **query)["deliveries"]
            return found if len(found) == count and all(d["status"] != "pending" for d in found) else None

        return wait_for(done, what=f"{count} webhook deliveries for {query} to settle", seconds=60)

    def turn(self, turn_id: str, *, key: str = KEY_A) -> dict[str, Any]:
        """GET /v1/turns/{turn_id}."""
        response = self.system.http.get(f"/v1/turns/{turn_id}", headers=self.system.headers(key))
        assert response.status_code == 200, response.text
        turn: dict[str, Any] = response.json()
        return turn


@pytest.fixture(scope="module")
def webhook_database(services: None) -> Iterator[str]:
    """A migrated PostgreSQL database of this module's own."""
    with fresh_database("aptix_test_wh") as url:
        yield url


@pytest.fixture(scope="module")
def webhooks(webhook_database: str, scripted_llm: ScriptedServer, modes_file: Path) -> Iterator[WebhookSystem]:
    """A gateway and an ``aptix worker`` serving every queue, webhooks included, with secrets for
    org-a and org-c (whose default endpoint is the receiver's ``/default-c``); org-b has none, org-d gets
    its own from ``aptix webhooks secret add``."""
    receiver = WebhookReceiver()
    with redis_databases(2) as (state_url, broker_url):
        env = system_env(
            database_url=webhook_database, redis_urls=(state_url, broker_url), llm=scripted_llm, modes_file=modes_file
        )
        env.update({
            "APTIX_API_KEYS": f"{API_KEYS},{KEY_C}:{ORG_C}:user-c,{KEY_D}:{ORG_D}:user-d",
            "APTIX_WEBHOOK_SECRETS": f"{ORG_A}:{SECRET_A},{ORG_C}:{SECRET_C}",
            "APTIX_WEBHOOK_DEFAULT_URLS": f"{ORG_C}:{receiver.url('/default-c')}",
            "APTIX_WEBHOOK_ALLOW_PRIVATE": "1",
            "APTIX_WEBHOOK_RETRY_SCHEDULE": ",".join(["0.2"] * RETRIES),
            "APTIX_RECONCILER_INTERVAL_SECONDS": "0.5",
        })  # fmt: skip
        stack = LocalStack(env)
        try:
            # No --pool: `aptix worker`'s own plan, deliveries on the llm process's gevent pool as deployed
            stack.start_worker("wh", queues="pipeline,llm,tools,webhooks", pool=None)
            _, url = stack.start_gateway()
            _, strict_url = stack.start_gateway(env={"APTIX_WEBHOOK_ALLOW_PRIVATE": "0"})
            system = System(stack=stack, gateway_url=url, llm=scripted_llm, env=env)
            yield WebhookSystem(system, receiver, strict_url, webhook_database)
        finally:
            stack.stop_all()
            receiver.close()


def _path() -> str:
    return f"/hook/{uuid.uuid4().hex[:12]}"


def _arrived(receiver: WebhookReceiver, path: str, count: int) -> list[Received]:
    return wait_for(
        lambda: found if len(found := receiver.received(path)) >= count else None,
        what=f"{count} webhook request(s) at {path}",
        seconds=60,
    )


def _aptix(webhooks: WebhookSystem, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``aptix …`` with the system's settings."""
    env = {**os.environ, **webhooks.system.env}
    return subprocess.run([sys.executable, "-m", "aptix_cli", *args], capture_output=True, text=True, env=env,
                          timeout=60)  # fmt: skip


def _verified(secret: str, request: Received) -> dict[str, Any]:
    """The event, once ``standardwebhooks`` has checked its signature (it raises if it does not match)."""
    event: dict[str, Any] = Webhook(secret).verify(request.body, request.headers)
    return event


def test_a_failing_endpoint_gets_the_same_signed_event_until_it_accepts(webhooks: WebhookSystem) -> None:
    # Given an endpoint that fails twice, then accepts
    path = _path()
    webhooks.receiver.script(path, [500, 500, 200])
    # When a turn that names it completes
    turn = webhooks.system.run_turn({"input": "hello hooks", "webhook_url": webhooks.receiver.url(path)})
    assert turn["status"] == "completed"
    # Then the endpoint got three attempts of one event: one id, one body, each signed for org-a
    attempts = _arrived(webhooks.receiver, path, 3)
    assert [request.answered for request in attempts] == [500, 500, 200]
    assert len({request.headers["webhook-id"] for request in attempts}) == 1
    assert len({request.body for request in attempts}) == 1
    events = [_verified(SECRET_A, request) for request in attempts]
    assert events[0]["id"] == attempts[0].headers["webhook-id"]
    assert events[0]["type"] == "turn.completed"
    assert events[0]["data"] == webhooks.turn(turn["turn_id"])
    # And the deliveries endpoint shows the three attempts and their status codes
    (delivery,) = webhooks.settled(turn_id=turn["turn_id"])
    assert (delivery["delivery_id"], delivery["status"]) == (events[0]["id"], "delivered")
    assert [attempt["status_code"] for attempt in delivery["attempts"]] == [500, 500, 200]
    assert [attempt["attempt"] for attempt in delivery["attempts"]] == [1, 2, 3]
    assert len(webhooks.receiver.received(path)) == 3


def test_a_delivery_is_given_up_when_its_retries_run_out(webhooks: WebhookSystem) -> None:
    path = _path()
    webhooks.receiver.script(path, [503])
    turn = webhooks.system.run_turn({"input": "nobody listens", "webhook_url": webhooks.receiver.url(path)})
    (delivery,) = webhooks.settled(turn_id=turn["turn_id"])
    assert delivery["status"] == "failed"
    assert [attempt["status_code"] for attempt in delivery["attempts"]] == [503] * (RETRIES + 1)
    assert len(webhooks.receiver.received(path)) == RETRIES + 1


def test_an_endpoint_that_answers_410_is_disabled_and_gets_nothing_more(webhooks: WebhookSystem) -> None:
    # Given an endpoint that answered 410 Gone to a turn's event
    path = _path()
    webhooks.receiver.script(path, [410])
    first = webhooks.system.run_turn({"input": "first", "webhook_url": webhooks.receiver.url(path)})
    (gone,) = webhooks.settled(turn_id=first["turn_id"])
    assert gone["status"] == "endpoint_disabled"
    assert [attempt["status_code"] for attempt in gone["attempts"]] == [410]
    # When a later turn names it
    later = webhooks.system.run_turn({"input": "second", "webhook_url": webhooks.receiver.url(path)})
    # Then its event is recorded but not sent
    (skipped,) = webhooks.settled(turn_id=later["turn_id"])
    assert (skipped["status"], skipped["attempts"]) == ("endpoint_disabled", [])
    assert len(webhooks.receiver.received(path)) == 1


def test_a_paused_then_resumed_turn_sends_both_events_in_order(webhooks: WebhookSystem) -> None:
    path = _path()
    url = webhooks.receiver.url(path)
    body = {"input": '[[call:open_file {"path": "a.txt"}]]', "tools": [OPEN_FILE], "webhook_url": url}
    paused = webhooks.system.run_turn(body)
    assert paused["status"] == "requires_client_tools"
    (pause,) = _arrived(webhooks.receiver, path, 1)
    event = _verified(SECRET_A, pause)
    assert event["type"] == "turn.requires_client_tools"
    assert event["data"]["pending_tool_calls"] == paused["pending_tool_calls"]
    call_id = paused["pending_tool_calls"][0]["call_id"]
    done = webhooks.system.resume(paused["turn_id"], [{"call_id": call_id, "output": "file text"}])
    assert done["status"] == "completed"
    _, finished = _arrived(webhooks.receiver, path, 2)
    assert _verified(SECRET_A, finished)["type"] == "turn.completed"
    types = [d["event_type"] for d in webhooks.settled(turn_id=paused["turn_id"], count=2)]
    assert types == ["turn.requires_client_tools", "turn.completed"]


def test_a_cancelled_turn_sends_turn_cancelled(webhooks: WebhookSystem) -> None:
    path = _path()
    response = webhooks.system.post_turn({"input": "[[sleep:3000]] slow", "webhook_url": webhooks.receiver.url(path)})
    assert response.status_code == 202, response.text
    turn_id = response.json()["turn_id"]
    cancelled = webhooks.system.http.post(f"/v1/turns/{turn_id}/cancel", headers=webhooks.system.headers())
    assert cancelled.status_code == 200, cancelled.text
    (request,) = _arrived(webhooks.receiver, path, 1)
    event = _verified(SECRET_A, request)
    assert (event["type"], event["data"]["status"]) == ("turn.cancelled", "cancelled")
    assert event["data"] == webhooks.turn(turn_id)


def test_an_organisation_default_endpoint_gets_events_of_requests_that_name_none(webhooks: WebhookSystem) -> None:
    turn = webhooks.system.run_turn({"input": f"default {uuid.uuid4().hex[:6]}"}, key=KEY_C)
    (delivery,) = webhooks.settled(key=KEY_C, turn_id=turn["turn_id"])
    assert (delivery["url"], delivery["status"]) == (webhooks.receiver.url("/default-c"), "delivered")
    received = webhooks.receiver.received("/default-c")
    (request,) = [r for r in received if r.headers["webhook-id"] == delivery["delivery_id"]]
    assert _verified(SECRET_C, request)["data"]["turn_id"] == turn["turn_id"]


def test_a_finished_batch_sends_one_batch_completed_event(webhooks: WebhookSystem) -> None:
    # Given a batch whose turns end every way a batch turn leaves flight, one with a webhook of its own
    path, turn_path = _path(), _path()
    requests = [
        {"input": "fine"},
        {"input": "[[call:format_disk {}]]"},
        {"input": '[[call:open_file {"path": "a"}]]', "tools": [OPEN_FILE]},
        {"input": "own hook", "webhook_url": webhooks.receiver.url(turn_path)},
    ]
    response = webhooks.system.http.post(
        "/v1/batches",
        json={"requests": requests, "webhook_url": webhooks.receiver.url(path)},
        headers=webhooks.system.headers(),
    )
    assert response.status_code == 202, response.text
    batch_id = response.json()["batch_id"]
    # When all of its turns are out of flight, then its endpoint gets one batch.completed event
    (request,) = _arrived(webhooks.receiver, path, 1)
    event = _verified(SECRET_A, request)
    assert event["type"] == "batch.completed"
    assert event["data"]["batch_id"] == batch_id and event["data"]["total"] == 4
    counts = event["data"]["counts"]
    assert (counts["completed"], counts["failed"], counts["requires_client_tools"]) == (2, 1, 1)
    assert counts["queued"] + counts["running"] == 0
    # And the batch's deliveries are its own event and the one turn's that named an endpoint
    deliveries = webhooks.settled(batch_id=batch_id, count=2)
    assert sorted(d["event_type"] for d in deliveries) == ["batch.completed", "turn.completed"]
    assert len(webhooks.receiver.received(path)) == 1


def test_a_delivery_nobody_enqueued_is_sent_by_the_sweep(webhooks: WebhookSystem) -> None:
    # Given a delivery recorded by a commit whose worker died before enqueueing it
    path = _path()
    delivery_id = f"msg_{uuid.uuid4().hex}"
    body = json.dumps({"id": delivery_id, "type": "turn.completed", "timestamp": "2026-01-01T00:00:00+00:00",
                       "data": {"note": "recorded, never enqueued"}})  # fmt: skip
    long_ago = datetime.now(UTC) - timedelta(minutes=5)
    engine = create_db_engine(webhooks.database_url, pool_size=1)
    with engine.begin() as conn:
        conn.execute(insert(WebhookDeliveryRow).values(
            delivery_id=delivery_id, event_key=f"test:{delivery_id}", org_id=ORG_A, event_type="turn.completed",
            url=webhooks.receiver.url(path), body=body, status="pending", attempts=0, next_attempt_at=long_ago,
            created_at=long_ago, updated_at=long_ago,
        ))  # fmt: skip
    engine.dispose()
    # Then the reconciler's sweep sends it, signed
    (request,) = _arrived(webhooks.receiver, path, 1)
    assert request.headers["webhook-id"] == delivery_id
    assert _verified(SECRET_A, request)["data"] == {"note": "recorded, never enqueued"}


def test_a_private_address_is_refused_at_submission(webhooks: WebhookSystem) -> None:
    import httpx

    with httpx.Client(base_url=webhooks.strict_url, timeout=30) as strict:
        for url, reason in [
            (webhooks.receiver.url("/x"), "loopback"),
            ("http://10.1.2.3/hook", "private"),
            ("http://169.254.169.254/latest/meta-data", "link-local"),
            ("ftp://example.com/hook", "http or https"),
        ]:
            response = strict.post("/v1/turns", json={"input": "hi", "webhook_url": url},
                                   headers={"Authorization": f"Bearer {KEY_A}"})  # fmt: skip
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["code"] == "webhook_url_not_allowed" and reason in error["message"], error
            assert error["details"][0]["loc"] == ["body", "webhook_url"]
        batch = strict.post(
            "/v1/batches", json={"requests": [{"input": "a"}, {"input": "b", "webhook_url": "http://192.168.0.9/"}]},
            headers={"Authorization": f"Bearer {KEY_A}"},
        )  # fmt: skip
        assert batch.status_code == 422, batch.text
        assert batch.json()["error"]["details"][0]["loc"] == ["body", "requests", 1, "webhook_url"]


def test_an_ipv6_address_carrying_a_loopback_or_link_local_ipv4_address_is_refused_at_submission(
    webhooks: WebhookSystem,
) -> None:
    import httpx

    with httpx.Client(base_url=webhooks.strict_url, timeout=30) as strict:
        for url, reason in [
            ("http://[2002:7f00:1::]/", "6to4 address carrying 127.0.0.1, a loopback address"),
            ("http://[2002:a9fe:a9fe::]/latest/meta-data", "6to4 address carrying 169.254.169.254, a link-local"),
            ("http://[64:ff9b::a9fe:a9fe]/", "NAT64 address carrying 169.254.169.254, a link-local"),
            ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "Teredo address carrying 127.0.0.1, a loopback"),
            ("http://[::ffff:10.0.0.1]:8080/", "IPv4-mapped address carrying 10.0.0.1, a private address"),
        ]:
            response = strict.post("/v1/turns", json={"input": "hi", "webhook_url": url},
                                   headers={"Authorization": f"Bearer {KEY_A}"})  # fmt: skip
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["code"] == "webhook_url_not_allowed" and reason in error["message"], error
            assert error["details"][0]["loc"] == ["body", "webhook_url"]
        batch = strict.post(
            "/v1/batches", json={"requests": [{"input": "a", "webhook_url": "http://[2002:7f00:1::]/"}]},
            headers={"Authorization": f"Bearer {KEY_A}"},
        )  # fmt: skip
        assert batch.status_code == 422, batch.text
        assert batch.json()["error"]["details"][0]["loc"] == ["body", "requests", 0, "webhook_url"]


def test_an_organisation_without_a_secret_is_told_why_its_webhook_url_is_refused(webhooks: WebhookSystem) -> None:
    response = webhooks.system.post_turn({"input": "hi", "webhook_url": webhooks.receiver.url(_path())}, key=KEY_B)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "webhook_not_configured"
    assert "no webhook secret" in error["message"] and "APTIX_WEBHOOK_SECRETS" in error["message"]


def test_deliveries_are_listed_for_the_callers_turns_only(webhooks: WebhookSystem) -> None:
    turn = webhooks.system.run_turn({"input": "mine", "webhook_url": webhooks.receiver.url(_path())})
    webhooks.settled(turn_id=turn["turn_id"])
    other = webhooks.system.http.get(
        "/v1/webhook-deliveries", params={"turn_id": turn["turn_id"]}, headers=webhooks.system.headers(KEY_C)
    )
    assert other.status_code == 404, other.text
    neither = webhooks.system.http.get("/v1/webhook-deliveries", headers=webhooks.system.headers())
    assert neither.status_code == 422, neither.text


def test_a_response_of_the_openai_face_sends_openai_events_that_unwrap_verifies(webhooks: WebhookSystem) -> None:
    # Given a response created through /openai/v1 that pauses for a function call, then resumes, and one cancelled
    import openai

    path = _path()
    url = webhooks.receiver.url(path)
    tool = {"type": "function", "name": "open_file", "parameters": OPEN_FILE["parameters"], "strict": False}
    with openai.OpenAI(base_url=webhooks.system.gateway_url + "/openai/v1", api_key=KEY_A, max_retries=0) as client:
        paused = client.responses.create(
            model="scripted-model", input='[[call:open_file {"path": "w.txt"}]]', tools=[tool],  # type: ignore[list-item]
            extra_body={"webhook_url": url},
        )  # fmt: skip
        call = next(item for item in paused.output if item.type == "function_call")
        done = client.responses.create(
            model="scripted-model", previous_response_id=paused.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "text"}],
        )  # fmt: skip
        slow = client.responses.create(
            model="scripted-model", input="[[sleep:3000]] slow", background=True, extra_body={"webhook_url": url}
        )
        client.responses.cancel(slow.id)
        # When the events arrive, Then the SDK verifies and parses each as OpenAI's event type for its response
        arrived = _arrived(webhooks.receiver, path, 3)
        events = [client.webhooks.unwrap(request.body, request.headers, secret=SECRET_A) for request in arrived]
    found = sorted((event.type, event.data.id) for event in events)
    assert found == sorted([
        ("response.completed", paused.id), ("response.completed", done.id), ("response.cancelled", slow.id),
    ])  # fmt: skip


def test_a_batch_of_the_openai_face_sends_openai_batch_events_that_unwrap_verifies(webhooks: WebhookSystem) -> None:
    # Given an OpenAI-face batch that runs to its end, one that is cancelled and one whose file is invalid
    import io

    import openai

    path = _path()
    url = webhooks.receiver.url(path)

    def upload(client: openai.OpenAI, lines: list[str]) -> str:
        rows = [{"custom_id": f"r{index}", "method": "POST", "url": "/v1/responses",
                 "body": {"model": "scripted-model", "input": text}} for index, text in enumerate(lines)]  # fmt: skip
        data = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
        return client.files.create(file=("b.jsonl", io.BytesIO(data)), purpose="batch").id

    with openai.OpenAI(base_url=webhooks.system.gateway_url + "/openai/v1", api_key=KEY_A, max_retries=0) as client:
        options: dict[str, Any] = {"endpoint": "/v1/responses", "completion_window": "24h",
                                   "extra_body": {"webhook_url": url}}  # fmt: skip
        done = client.batches.create(input_file_id=upload(client, ["one", "two"]), **options)
        slow = client.batches.create(input_file_id=upload(client, ["[[sleep:3000]] slow"] * 4), **options)
        client.batches.cancel(slow.id)
        bad = client.files.create(file=("bad.jsonl", io.BytesIO(b"not json\n")), purpose="batch")
        failed = client.batches.create(input_file_id=bad.id, **options)
        assert failed.status == "validating"  # then failed, its event sent
        # When the events arrive, Then the SDK verifies and parses each as OpenAI's batch event, once per batch
        arrived = _arrived(webhooks.receiver, path, 3)
        events = [client.webhooks.unwrap(request.body, request.headers, secret=SECRET_A) for request in arrived]
    found = sorted((event.type, event.model_dump()["data"]["id"]) for event in events)
    assert found == sorted([("batch.completed", done.id), ("batch.cancelled", slow.id), ("batch.failed", failed.id)])
    assert len(webhooks.receiver.received(path)) == 3  # and none for the batches' requests


def test_while_two_secrets_are_active_receivers_of_either_verify_every_delivery(webhooks: WebhookSystem) -> None:
    system = webhooks.system
    # Given org-d's first secret, added with the CLI (the gateway takes its webhook_url within 5 s)
    added = _aptix(webhooks, "webhooks", "secret", "add", "--org", ORG_D, "--json")
    assert added.returncode == 0, added.stderr
    old = json.loads(added.stdout)

    def accepted(path: str) -> dict[str, Any] | None:
        response = system.post_turn({"input": "rotate", "webhook_url": webhooks.receiver.url(path)}, key=KEY_D)
        assert response.status_code in (202, 422), response.text
        return response.json() if response.status_code == 202 else None

    def delivered() -> Received | None:
        # A turn's event is recorded once its worker sees the secret too (within 5 s): until then, none
        path = _path()
        turn = wait_for(lambda: accepted(path), what="the gateway to see org-d's secret", seconds=5)
        system.wait_turn(turn["turn_id"], key=KEY_D)
        recorded = webhooks.deliveries(key=KEY_D, turn_id=turn["turn_id"])["deliveries"]
        return _arrived(webhooks.receiver, path, 1)[0] if recorded else None

    alone = wait_for(delivered, what="a delivery signed with org-d's secret", seconds=10)
    _verified(old["secret"], alone)
    # When a second one is added: within 5 s every delivery carries both signatures
    new = json.loads(_aptix(webhooks, "webhooks", "secret", "add", "--org", ORG_D, "--json").stdout)

    def signed_twice() -> Received | None:
        request = delivered()
        return request if request and len(request.headers["webhook-signature"].split(" ")) == 2 else None

    deliveries = [wait_for(signed_twice, what="deliveries signed with both secrets", seconds=10)]
    deliveries += [signed_twice() for _ in range(4)]
    # Then a receiver verifying with the old secret and one verifying with the new both accept every delivery
    assert all(request is not None for request in deliveries)
    for request in deliveries:
        assert request is not None
        assert _verified(old["secret"], request)["type"] == "turn.completed"
        assert _verified(new["secret"], request)["type"] == "turn.completed"
    # And once the old one is retired, deliveries carry the new signature alone
    listed = json.loads(_aptix(webhooks, "webhooks", "secret", "list", "--org", ORG_D, "--json").stdout)
    assert [entry["id"] for entry in listed] == [old["id"], new["id"]] and "secret" not in listed[0]
    assert _aptix(webhooks, "webhooks", "secret", "retire", old["id"]).returncode == 0

    def signed_once() -> Received | None:
        request = delivered()
        return request if request and len(request.headers["webhook-signature"].split(" ")) == 1 else None

    last = wait_for(signed_once, what="deliveries signed with the new secret alone", seconds=10)
    _verified(new["secret"], last)
    with pytest.raises(Exception, match="No matching signature"):
        _verified(old["secret"], last)
    # And bad input exits non-zero: an unknown id, a secret that is not whsec_ base64
    unknown = _aptix(webhooks, "webhooks", "secret", "retire", "whs_0000000000000000")
    bad = _aptix(webhooks, "webhooks", "secret", "add", "--org", ORG_D, "--secret", "not-a-secret")
    assert (unknown.returncode, bad.returncode) == (1, 2), (unknown.stderr, bad.stderr)


def test_aptix_webhooks_enable_brings_a_disabled_endpoint_back(webhooks: WebhookSystem) -> None:
    # Given an endpoint of org-a disabled by a 410 Gone
    path = _path()
    url = webhooks.receiver.url(path)
    webhooks.receiver.script(path, [410])
    gone = webhooks.system.run_turn({"input": "gone", "webhook_url": url})
    assert webhooks.settled(turn_id=gone["turn_id"])[0]["status"] == "endpoint_disabled"

    def endpoint() -> dict[str, Any]:
        response = webhooks.system.http.get("/v1/webhook-endpoints", headers=webhooks.system.headers())
        assert response.status_code == 200, response.text
        (found,) = [entry for entry in response.json()["endpoints"] if entry["url"] == url]
        return found

    assert (endpoint()["state"], endpoint()["deliveries"]) == ("disabled", 1)
    assert "410" in endpoint()["disabled_reason"]
    # When the operator enables it again (the receiver is back)
    webhooks.receiver.script(path, [200])
    done = _aptix(webhooks, "webhooks", "enable", "--org", ORG_A, url, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "enabled"
    # Then the list says so and the next event is delivered
    assert endpoint()["state"] == "enabled"
    back = webhooks.system.run_turn({"input": "back", "webhook_url": url})
    (delivered,) = webhooks.settled(turn_id=back["turn_id"])
    assert delivered["status"] == "delivered"
    _verified(SECRET_A, _arrived(webhooks.receiver, path, 2)[-1])
    # And enabling an endpoint that is not disabled is refused
    again = _aptix(webhooks, "webhooks", "enable", "--org", ORG_A, url)
    assert again.returncode == 1 and "not a disabled endpoint" in again.stderr
