"""Organisations' own limits end to end: two gateway processes and a worker on a database of their own,
limits set with the real ``aptix orgs set`` command.

- One organisation's client sending ten times its requests per minute, spread over both gateways, gets
  429 ``rate_limited`` with ``Retry-After`` for all but its limit (twice it, if the burst straddles a
  minute), while another organisation's turns run, every one of them completed.
- A daily token budget refuses the next turn once the turns' usage reached it, and ``GET /v1/usage``
  agrees with the sum of the turns' ``usage``.
- An organisation's own admission cap is applied without a restart (``aptix orgs show`` reads it back).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripted_llm import ScriptedServer
from tests.conftest import redis_databases
from tests.integration.conftest import System, system_env
from tests.support.databases import fresh_database
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

KEY_R, ORG_R = "test-key-rpm", "org-rpm"
KEY_Q, ORG_Q = "test-key-quota", "org-quota"
KEY_O, ORG_O = "test-key-other", "org-other"
RPM = 20


class LimitsSystem:
    """The system and its second gateway."""

    def __init__(self, system: System, second_url: str) -> None:
        self.system = system
        self.second = httpx.Client(base_url=second_url, timeout=60.0)

    def aptix(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``aptix …`` with the system's settings."""
        env = {**os.environ, **self.system.env}
        return subprocess.run(
            [sys.executable, "-m", "aptix_cli", *args], capture_output=True, text=True, env=env, timeout=60
        )


@pytest.fixture(scope="module")
def limits(scripted_llm: ScriptedServer, modes_file: Path, services: None) -> Iterator[LimitsSystem]:
    with fresh_database("aptix_test_limits") as database_url, redis_databases(2) as urls:
        env = system_env(database_url=database_url, redis_urls=tuple(urls), llm=scripted_llm, modes_file=modes_file)
        env["APTIX_API_KEYS"] = f"{KEY_R}:{ORG_R}:u1,{KEY_Q}:{ORG_Q}:u2,{KEY_O}:{ORG_O}:u3"
        stack = LocalStack(env)
        try:
            stack.start_worker("lim")
            _, url = stack.start_gateway()
            _, second_url = stack.start_gateway()
            system = System(stack=stack, gateway_url=url, llm=scripted_llm, env=env)
            running = LimitsSystem(system, second_url)
            yield running
            running.second.close()
            system.http.close()
        finally:
            stack.stop_all()


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_client_over_its_rpm_gets_429s_while_another_organisations_turns_run(limits: LimitsSystem) -> None:
    # Given org-rpm's limit of 20 requests a minute, applied by both gateways within 5 s
    done = limits.aptix("orgs", "set", ORG_R, "--rpm", str(RPM), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rpm"] == RPM
    clients = [limits.system.http, limits.second]

    def refused_by(client: httpx.Client) -> httpx.Response | None:
        response = client.get("/v1/modes", headers=_headers(KEY_R))
        return response if response.status_code == 429 else None

    for client in clients:
        wait_for(lambda client=client: refused_by(client), what="the gateway to apply the rpm limit", seconds=5)

    # When org-rpm sends ten times its limit over both gateways while org-other runs turns
    def burst(index: int) -> httpx.Response:
        client = clients[index % 2]
        return client.post("/v1/turns", json={"input": f"burst {index}"}, headers=_headers(KEY_R))

    with ThreadPoolExecutor(max_workers=8) as pool:
        other = [pool.submit(limits.system.run_turn, {"input": f"other {n}"}, key=KEY_O) for n in range(6)]
        answers = list(pool.map(burst, range(10 * RPM)))
        others = [future.result() for future in other]
    # Then org-rpm got at most its limit accepted (twice it if the burst straddled a minute; the probes
    # above counted too), the rest 429 rate_limited with Retry-After
    accepted = [a for a in answers if a.status_code == 202]
    refused = [a for a in answers if a.status_code == 429]
    assert len(accepted) + len(refused) == len(answers), {a.status_code for a in answers}
    assert len(accepted) <= 2 * RPM and len(refused) >= 8 * RPM
    for answer in refused:
        assert answer.json()["error"]["code"] == "rate_limited"
        assert 1 <= int(answer.headers["Retry-After"]) <= 60
    # And org-other was not limited: every turn of it completed
    assert [turn["status"] for turn in others] == ["completed"] * 6
    # And a refused request recorded nothing: only accepted ones are turns
    usage = limits.system.http.get("/v1/usage", headers=_headers(KEY_O)).json()
    assert usage["data"][-1]["turns"] == 6


def test_a_spent_token_budget_refuses_the_next_turn_and_usage_agrees(limits: LimitsSystem) -> None:
    # Given org-quota's turns with the scripted model's usage, and a budget set just below what they used
    turns = [limits.system.run_turn({"input": f"count my words {n} " + "word " * n}, key=KEY_Q) for n in range(4)]
    used = sum(turn["usage"]["input_tokens"] + turn["usage"]["output_tokens"] for turn in turns)
    assert used > 0 and all(turn["status"] == "completed" for turn in turns)
    done = limits.aptix("orgs", "set", ORG_Q, "--tokens-per-day", str(used))
    assert done.returncode == 0, done.stderr
    # When it starts another turn (once the gateways read the budget: within 5 s; one accepted before runs)
    extra: list[str] = []

    def refused() -> httpx.Response | None:
        response = limits.system.post_turn({"input": "one more"}, key=KEY_Q)
        assert response.status_code in (202, 429), response.text
        if response.status_code == 202:
            extra.append(response.json()["turn_id"])
        return response if response.status_code == 429 else None

    answer = wait_for(refused, what="the token budget to refuse a turn", seconds=5)
    # Then it is refused quota_exceeded until the next UTC day, on the other gateway too, batches included
    assert answer.json()["error"]["code"] == "quota_exceeded"
    assert 1 <= int(answer.headers["Retry-After"]) <= 86401

    # (the second gateway reads the budget on its own refresh, within the same 5 s: a turn it still took
    # runs, and counts in the usage below)
    def refused_on_second() -> httpx.Response | None:
        response = limits.second.post("/v1/turns", json={"input": "one more"}, headers=_headers(KEY_Q))
        assert response.status_code in (202, 429), response.text
        if response.status_code == 202:
            extra.append(response.json()["turn_id"])
        return response if response.status_code == 429 else None

    wait_for(refused_on_second, what="the second gateway to refuse a turn", seconds=5)
    batch = limits.second.post("/v1/batches", json={"requests": [{"input": "x"}]}, headers=_headers(KEY_Q))
    assert (batch.status_code, batch.json()["error"]["code"]) == (429, "quota_exceeded")
    # And the usage endpoint agrees with the sum of the turns' usage, and with the budget's count
    turns += [limits.system.wait_turn(turn_id, key=KEY_Q) for turn_id in extra]
    spent = sum(turn["usage"]["input_tokens"] + turn["usage"]["output_tokens"] for turn in turns)
    usage = limits.second.get("/v1/usage", headers=_headers(KEY_Q))
    assert usage.status_code == 200, usage.text
    body = usage.json()
    today = body["data"][-1]
    assert (today["turns"], today["total_tokens"], body["tokens_today"]) == (len(turns), spent, spent)
    assert (today["input_tokens"] + today["output_tokens"], body["tokens_per_day"]) == (spent, used)
    assert today["llm_calls"] == sum(turn["usage"]["llm_calls"] for turn in turns)


def test_usage_refuses_a_range_backwards_or_too_long(limits: LimitsSystem) -> None:
    http = limits.system.http
    backwards = http.get("/v1/usage", params={"from": "2026-12-05", "to": "2026-12-01"}, headers=_headers(KEY_O))
    too_long = http.get("/v1/usage", params={"from": "2024-01-01", "to": "2026-12-01"}, headers=_headers(KEY_O))
    not_a_date = http.get("/v1/usage", params={"from": "yesterday"}, headers=_headers(KEY_O))
    assert [r.status_code for r in (backwards, too_long, not_a_date)] == [422, 422, 422]
    week = http.get("/v1/usage", params={"to": "2026-12-07"}, headers=_headers(KEY_O)).json()
    assert [day["date"] for day in week["data"]] == [f"2026-12-0{n}" for n in range(1, 8)]


def test_orgs_show_reads_back_what_set_wrote_and_bad_input_exits_non_zero(limits: LimitsSystem) -> None:
    org = f"org-{uuid.uuid4().hex[:6]}"
    assert limits.aptix("orgs", "set", org, "--max-in-flight", "3", "--rpm", "none").returncode == 0
    shown: dict[str, Any] = json.loads(limits.aptix("orgs", "show", org, "--json").stdout)
    assert (shown["max_in_flight"], shown["rpm"], shown["tokens_per_day"]) == (3, None, None)
    for args in (["--rpm", "0"], ["--tokens-per-day", "lots"], []):
        done = limits.aptix("orgs", "set", org, *args)
        assert done.returncode == 2 and done.stderr.startswith("error: "), (args, done.stderr)
    bad_org = limits.aptix("orgs", "set", "no spaces", "--rpm", "5")
    assert bad_org.returncode == 2 and "organisation id" in bad_org.stderr
