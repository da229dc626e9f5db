"""The organisations' limits on a real Redis: the requests-per-minute window and the daily token count
(``shared.state.request_rate``, ``shared.state.token_usage``). Times are injected: nothing here waits."""

from __future__ import annotations

import asyncio
from datetime import date

import pytest
import redis
import redis.asyncio as aioredis

from shared.state.request_rate import RequestRate
from shared.state.scripts import pipelined
from shared.state.token_usage import TokenUsage, TurnTokens, merge_calls

pytestmark = pytest.mark.integration

MINUTE = 28_333_333 * 60.0
"""The start of a minute (Unix time)."""
DAY = date(2026, 12, 1)


def _commit(client: redis.Redis, org_id: str, turn_id: str, tokens: int) -> None:
    """What a turn's last save sends for its commit's tokens (``RedisStateStore.save(tokens=...)``)."""
    calls = merge_calls(client)(TurnTokens(org_id, DAY, turn_id, tokens))
    if calls:
        pipelined(client, calls)


def test_a_minute_admits_the_limit_then_refuses_until_the_next_minute(redis_db_url: str) -> None:
    async def hits() -> list[tuple[bool, int]]:
        client = aioredis.Redis.from_url(redis_db_url)
        rate = RequestRate(client)
        seen = []
        for n in range(5):
            verdict = await rate.hit("org-a", limit=3, now=MINUTE + 10 + n)
            seen.append((verdict.allowed, verdict.retry_after))
        other = await rate.hit("org-b", limit=3, now=MINUTE + 20)
        later = await rate.hit("org-a", limit=3, now=MINUTE + 60)
        await client.aclose()
        return [*seen, (other.allowed, other.retry_after), (later.allowed, later.retry_after)]

    seen = asyncio.run(hits())
    # three go; the fourth and fifth wait for the next minute (47 s and 46 s); org-b counts apart; the next minute opens
    assert seen == [(True, 0), (True, 0), (True, 0), (False, 47), (False, 46), (True, 0), (True, 0)]


def test_a_commit_counted_twice_counts_once_and_a_later_one_adds_the_difference(redis_client: redis.Redis) -> None:
    usage = TokenUsage(redis_client)
    _commit(redis_client, "org-a", "turn_1", 100)
    _commit(redis_client, "org-a", "turn_1", 100)  # the same commit again (a redelivered persist)
    _commit(redis_client, "org-a", "turn_2", 30)
    _commit(redis_client, "org-a", "turn_1", 150)  # the turn's next round
    _commit(redis_client, "org-b", "turn_3", 7)
    assert usage.spent("org-a", DAY, seed=dict) == 180
    assert usage.spent("org-b", DAY, seed=dict) == 7
    # and a turn that used no tokens sends nothing
    assert merge_calls(redis_client)(TurnTokens("org-c", DAY, "turn_4", 0)) == []


def test_a_day_redis_has_no_count_of_is_seeded_once_and_merges_what_commits_said(redis_client: redis.Redis) -> None:
    # Given a commit that reached Redis (turn_2's second round) and a database that still has turn_2's first
    usage = TokenUsage(redis_client)
    _commit(redis_client, "org-a", "turn_2", 80)
    seeds: list[int] = []

    def seed() -> dict[str, int]:
        seeds.append(1)
        return {"turn_1": 100, "turn_2": 50}

    # When the budget is read: the database's turns are merged, each turn counted at its largest
    assert usage.spent("org-a", DAY, seed=seed) == 180
    # Then the day is seeded: later reads do not read the database again, and commits still add
    _commit(redis_client, "org-a", "turn_3", 20)
    assert usage.spent("org-a", DAY, seed=seed) == 200
    assert seeds == [1]


def test_an_empty_day_is_seeded_as_zero(redis_client: redis.Redis) -> None:
    usage = TokenUsage(redis_client)
    assert usage.spent("org-a", DAY, seed=dict) == 0
    assert usage.spent("org-a", DAY, seed=lambda: {"turn_late": 5}) == 0  # seeded: the database is not read again
