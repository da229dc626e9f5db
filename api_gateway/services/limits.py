"""OrgLimitsService: an organisation's own limits at the gateway — requests per minute, tokens per day —
and its usage per day (``GET /v1/usage``).

Each organisation's limits come from ``org_settings`` (``aptix orgs set``), read by each gateway at
most every ``shared.ttl_cache.REFRESH_SECONDS`` (one query for every organisation). An organisation
with no limit of its own costs a request one dictionary look-up.

- **Requests per minute** (``rpm``): :meth:`OrgLimitsService.admit` counts each authenticated request
  in Redis, every gateway together (``shared.state.request_rate``: one round trip), before the route
  reads its body or records anything; past the limit, 429 ``rate_limited`` with ``Retry-After``. Redis
  not answering lets the request through (logged): the limit is no reason for an outage of its own.
- **Tokens per day** (``tokens_per_day``): :meth:`OrgLimitsService.check_quota` refuses a new turn (or
  batch) with 429 ``quota_exceeded`` once the organisation's turns created this UTC day used that many
  tokens (``shared.state.token_usage``, merged by the workers at each commit); ``Retry-After``: the
  seconds to the next UTC midnight. Turns accepted before keep running, and a paused turn's tool results
  are still taken.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import redis
from starlette.concurrency import run_in_threadpool

from api_gateway.services.errors import InvalidRequest, Limited
from shared.db.org_settings import OrgLimits, OrgSettingsRepository
from shared.db.usage import DayUsage, UsageRepository
from shared.state.request_rate import RequestRate
from shared.state.token_usage import TokenUsage
from shared.ttl_cache import Cached

__all__ = ["MAX_USAGE_DAYS", "OrgLimitsService", "UsageReport"]

logger = logging.getLogger(__name__)

MAX_USAGE_DAYS = 366
"""The longest range ``GET /v1/usage`` answers, in days."""
_RATE_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class UsageReport:
    """An organisation's usage over a range of days, with its budget and what today's turns used of it."""

    first: date
    last: date
    days: list[DayUsage]
    tokens_per_day: int | None
    tokens_today: int


class OrgLimitsService:
    """Applies each organisation's rpm and daily token budget; built once per gateway."""

    def __init__(
        self,
        *,
        settings: OrgSettingsRepository,
        usage: UsageRepository,
        rate: RequestRate,
        tokens: TokenUsage,
        clock: Callable[[], datetime],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._limits = Cached(settings.all, what="the organisations' limits (org_settings)")
        self._usage = usage
        self._rate = rate
        self._tokens = tokens
        self._clock = clock
        self._wall = wall

    def limits_for(self, org_id: str) -> OrgLimits:
        """The organisation's limits as this gateway knows them (read again every few seconds)."""
        return self._limits.get().get(org_id) or OrgLimits(org_id)

    async def admit(self, org_id: str) -> None:
        """Count one request of ``org_id`` against its requests per minute, if it has a limit.

        Reads the cached limits (the database, when they are due for a read); writes the organisation's
        counter of this minute in Redis.

        Raises:
            Limited: ``rate_limited``, with the seconds until the next minute's window.
        """
        known = self._limits.get() if self._limits.fresh else await run_in_threadpool(self._limits.get)
        limits = known.get(org_id)
        if limits is None or limits.rpm is None:
            return
        try:
            verdict = await asyncio.wait_for(
                self._rate.hit(org_id, limit=limits.rpm, now=self._wall()), _RATE_TIMEOUT_SECONDS
            )
        except (redis.RedisError, TimeoutError) as exc:
            logger.warning("request rate of organisation %s not counted (%s): the request goes on",
                           org_id, type(exc).__name__)  # fmt: skip
            return
        if not verdict.allowed:
            raise Limited(
                "rate_limited",
                f"organisation {org_id!r} made more than its {limits.rpm} requests this minute; "
                f"retry after {verdict.retry_after}s",
                retry_after=verdict.retry_after,
            )

    def check_quota(self, org_id: str) -> None:
        """Refuse a new turn of ``org_id`` when its turns created today used its daily tokens, if it has a budget.

        Reads the day's count in Redis (seeded from ``turns`` the first time a day is read without one).

        Raises:
            Limited: ``quota_exceeded``, with the seconds until the next UTC midnight.
            redis.RedisError: Redis did not answer (503).
        """
        budget = self.limits_for(org_id).tokens_per_day
        if budget is None:
            return
        now = self._clock().astimezone(UTC)
        today = now.date()
        spent = self._tokens.spent(org_id, today, seed=lambda: self._usage.tokens_by_turn(org_id, today))
        if spent >= budget:
            midnight = datetime.combine(today + timedelta(days=1), datetime.min.time(), UTC)
            raise Limited(
                "quota_exceeded",
                f"organisation {org_id!r} used {spent} of its {budget} tokens for {today.isoformat()} (UTC); "
                "new turns are refused until the next UTC day",
                retry_after=max(1, int((midnight - now).total_seconds()) + 1),
            )

    def usage(self, org_id: str, *, first: date | None, last: date | None) -> UsageReport:
        """The organisation's turns and tokens per UTC day from ``first`` to ``last`` (default: the last 7 days).

        Reads ``turns`` (grouped by day) and, when the organisation has a budget, today's count in Redis.

        Raises:
            InvalidRequest: ``first`` after ``last``, or a range longer than :data:`MAX_USAGE_DAYS`.
        """
        today = self._clock().astimezone(UTC).date()
        if last is None:
            last = today if first is None or first <= today else first
        if first is None:
            first = last - timedelta(days=6)
        if first > last:
            raise InvalidRequest(
                "from is after to", [{"loc": ["query", "from"], "msg": "after to", "type": "value_error"}]
            )
        if (last - first).days + 1 > MAX_USAGE_DAYS:
            raise InvalidRequest(
                f"the range is longer than {MAX_USAGE_DAYS} days",
                [{"loc": ["query", "from"], "msg": f"over {MAX_USAGE_DAYS} days before to", "type": "value_error"}],
            )
        budget = self.limits_for(org_id).tokens_per_day
        days = self._usage.daily(org_id, first=first, last=last)
        if budget is not None:  # what the budget is held to
            spent = self._tokens.spent(org_id, today, seed=lambda: self._usage.tokens_by_turn(org_id, today))
        else:
            listed = [day for day in days if day.day == today]
            spent = (listed or self._usage.daily(org_id, first=today, last=today))[0].total_tokens
        return UsageReport(first, last, days, budget, spent)
