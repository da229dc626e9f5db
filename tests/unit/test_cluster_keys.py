"""The state store's keys on Redis Cluster: one slot per turn, organisation and model; the URL that names a
cluster; the release plan that replaced the cross-organisation script; scripts a node has not loaded."""

from __future__ import annotations

import fakeredis
import pytest
from pydantic import ValidationError
from redis.crc import key_slot

from shared.redis_cluster import ClusterUrl, is_cluster_url, parse_cluster_url
from shared.settings import Settings
from shared.state.admission import _interleave, _round_robin
from shared.state.keys import (
    TIMER_SHARDS,
    alive_key,
    cancel_key,
    claim_key,
    deliveries_key,
    events_key,
    held_key,
    in_flight_key,
    org_releasing_key,
    org_sequence_key,
    state_key,
    timer_shard,
    timers_keys,
    version_key,
)
from shared.state.redis_store import RedisStateStore
from shared.state.scripts import ScriptCall, pipelined
from workers.llm.breaker import breaker_key
from workers.llm.limiter import limiter_keys

TURN = "turn_0123456789abcdef0123456789abcdef"


def _slots(keys: list[str]) -> set[int]:
    return {key_slot(key.encode()) for key in keys}


def test_every_key_of_a_turn_is_in_one_slot_and_turns_spread_over_slots() -> None:
    keys = [
        state_key(TURN), version_key(TURN), claim_key(TURN, "0:1:compose:1"), deliveries_key(TURN, "0:1:compose:1"),
        cancel_key(TURN), events_key(TURN), alive_key(TURN),
    ]  # fmt: skip
    assert len(_slots(keys)) == 1
    assert _slots(keys) == _slots([f"{{{TURN}}}"])  # the turn id is the hash tag
    assert len(_slots([state_key(f"turn_{n:032x}") for n in range(200)])) > 150


@pytest.mark.parametrize("org", ["org-a", "acme:eu", "o}dd", "{braced"])
def test_every_key_of_an_organisation_is_in_one_slot(org: str) -> None:
    assert len(_slots([held_key(org), in_flight_key(org), org_sequence_key(org), org_releasing_key(org)])) == 1


def test_a_models_limiter_and_breaker_keys_share_a_slot() -> None:
    limit, pause = limiter_keys("https://api.example.com/v1", "gpt-4.1")
    assert len(_slots([limit, pause, breaker_key("https://api.example.com/v1/", "gpt-4.1")])) == 1


def test_parked_timers_are_sharded_and_an_envelope_always_goes_to_the_same_shard() -> None:
    assert len(timers_keys()) == TIMER_SHARDS and len(_slots(timers_keys())) == TIMER_SHARDS
    envelopes = [f'{{"turn_id": "turn_{n}"}}' for n in range(400)]
    assert {timer_shard(envelope) for envelope in envelopes} == set(timers_keys())
    assert timer_shard(envelopes[0]) == timer_shard(envelopes[0])


def test_a_cluster_url_names_its_nodes_and_credentials() -> None:
    assert is_cluster_url("redis+cluster://h:1") and is_cluster_url("REDISS+CLUSTER://h:1")
    assert not is_cluster_url("redis://h:6379/0") and not is_cluster_url("sentinel://h:26379/m")
    assert parse_cluster_url("redis+cluster://:s%40cret@10.0.0.1:7000,10.0.0.2:7001/0") == ClusterUrl(
        (("10.0.0.1", 7000), ("10.0.0.2", 7001)), None, "s@cret", False
    )
    assert parse_cluster_url("rediss+cluster://u:p@[::1]:7000") == ClusterUrl((("::1", 7000),), "u", "p", True)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://", "at least one node"),
        ("redis+cluster://host", "HOST:PORT"),
        ("redis+cluster://host:0", "HOST:PORT"),
        ("redis+cluster://h:1/2", "database 0 only"),
        ("redis://h:1", "scheme"),
    ],
)
def test_a_bad_cluster_url_is_refused_saying_why(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_cluster_url(url)


def test_settings_take_a_cluster_for_the_state_store_only_and_ask_for_a_broker_beside_it() -> None:
    settings = Settings(redis_url="redis+cluster://127.0.0.1:7000", broker_url="redis://127.0.0.1:6379/1")
    assert settings.effective_broker_url == "redis://127.0.0.1:6379/1"
    with pytest.raises(ValidationError, match="set APTIX_BROKER_URL"):
        Settings(redis_url="redis+cluster://127.0.0.1:7000")
    with pytest.raises(ValidationError, match="APTIX_BROKER_URL cannot name a Redis Cluster"):
        Settings(broker_url="redis+cluster://127.0.0.1:7000")
    with pytest.raises(ValidationError, match="HOST:PORT"):
        Settings(redis_url="redis+cluster://nowhere", broker_url="redis://127.0.0.1:6379/1")


def test_a_release_plan_serves_one_turn_per_organisation_per_round_from_after_the_cursor() -> None:
    room = {"a": 5, "b": 1, "c": 0, "d": 2}
    plan, last = _round_robin(["a", "b", "c", "d"], "b", room, limit=6)
    assert plan == {"d": 2, "a": 3, "b": 1} and last == "a"
    assert list(plan) == ["d", "a", "b"]  # the order the round went in
    assert _round_robin(["a", "b"], "", {"a": 0, "b": 0}, limit=10) == ({}, None)
    assert _round_robin(["a", "b"], "z", {"a": 9, "b": 9}, limit=3) == ({"a": 2, "b": 1}, "a")
    assert _interleave([["d1", "d2"], ["a1", "a2", "a3"], ["b1"]]) == ["d1", "a1", "b1", "d2", "a2", "a3"]


def test_a_pipelined_script_a_redis_does_not_have_is_loaded_and_run_once() -> None:
    client = fakeredis.FakeRedis()
    script = client.register_script("return redis.call('incr', KEYS[1])")
    client.script_flush()
    replies = pipelined(client, [ScriptCall(script, ["n"], []), ("INCR", "m"), ScriptCall(script, ["n"], [])])
    assert replies == [1, 1, 2] and client.get("n") == b"2"


def test_old_untagged_keys_are_not_read_and_the_timers_and_keys_without_expiry_are_retired() -> None:
    from shared.state.keys import LEGACY_KEYS, LEGACY_TIMERS_KEY
    from shared.state.legacy import retire_legacy_keys

    client = fakeredis.FakeRedis()
    client.zadd(LEGACY_TIMERS_KEY, {'{"turn_id": "t1"}': 10.0, '{"turn_id": "t2"}': 20.0})
    client.zadd("aptix:inflight", {TURN: 1e12})
    client.sadd("aptix:admission:orgs", "o")
    store = RedisStateStore(client)
    assert store.alive_until([TURN]) == {}  # the old marker vouches for nothing
    assert retire_legacy_keys(client) == 2
    assert store.pop_due(now=15.0) == ['{"turn_id": "t1"}'] and store.pop_due(now=25.0) == ['{"turn_id": "t2"}']
    assert not client.exists(LEGACY_TIMERS_KEY, *LEGACY_KEYS)
    assert retire_legacy_keys(client) == 0
