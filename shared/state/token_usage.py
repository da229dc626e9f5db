"""TokenUsage: the tokens each organisation's turns used per UTC day, counted in Redis for the daily budget.

A hash per organisation and day (``org_tokens_key``; the day a turn was created): a field per turn
holding its tokens (input + output) as last committed, and ``total``, their sum. A commit *merges*
its turn's count (one Lua script, one round trip): the field takes the larger of the two and
``total`` the difference, so a commit that runs twice counts once, and the count of a turn only
grows, as its usage does. The same merge seeds a day Redis has no count of (lost, or begun before
this code ran) from the database (``shared.db.usage``), turn by turn, then marks it ``seeded``: a
commit that lands between the database read and the seed is neither lost nor counted twice. So the
``total`` is the sum of the turns' committed usage, which ``GET /v1/usage`` sums too. A worker that
dies between its commit and the merge leaves its turn short until its next commit (or a seed).

The scripts build no keys: one Redis, no cluster, like every Aptix Lua script.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date

import redis

from shared.state.keys import org_tokens_key

__all__ = ["KEEP_SECONDS", "TokenUsage"]

KEEP_SECONDS = 3 * 86400
"""How long a day's count outlives its last commit (a turn that runs past midnight still merges)."""
_CHUNK = 1000

# ARGV: how long to keep the hash, '1' to mark it seeded (else '0'), then turn id and tokens pairs.
_MERGE = """
local added = 0
for i = 3, #ARGV, 2 do
  local field = 't:' .. ARGV[i]
  local used = tonumber(ARGV[i + 1])
  local old = tonumber(redis.call('hget', KEYS[1], field) or '0')
  if used > old then
    redis.call('hset', KEYS[1], field, used)
    added = added + used - old
  end
end
if added > 0 then redis.call('hincrby', KEYS[1], 'total', added) end
if ARGV[2] == '1' then redis.call('hset', KEYS[1], 'seeded', '1') end
redis.call('expire', KEYS[1], tonumber(ARGV[1]))
return redis.call('hget', KEYS[1], 'total') or 0
"""


class TokenUsage:
    """Per-organisation daily token counts on the state store's Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._merge = client.register_script(_MERGE)

    def record(self, org_id: str, day: date, turn_id: str, tokens: int) -> None:
        """Merge a turn's tokens as committed (its count takes the larger; ``total`` grows by the difference).

        Raises:
            redis.RedisError: Redis did not answer (the count stays short until the turn's next commit).
        """
        if tokens <= 0:
            return
        self._merge(keys=[org_tokens_key(org_id, day.isoformat())], args=[KEEP_SECONDS, "0", turn_id, tokens])

    def spent(self, org_id: str, day: date, *, seed: Callable[[], Mapping[str, int]]) -> int:
        """The tokens the organisation's turns created on ``day`` used, seeding the count from ``seed``
        (each turn's tokens in the database) when Redis has not got it.

        Reads the day's ``total`` and ``seeded`` (one round trip); when unseeded, ``seed`` once and merges it.

        Raises:
            redis.RedisError: Redis did not answer.
        """
        key = org_tokens_key(org_id, day.isoformat())
        total, seeded = self._client.hmget(key, ["total", "seeded"])
        if seeded is not None:
            return int(total or 0)
        pairs = [item for turn_id, used in seed().items() for item in (turn_id, used)]
        merged = 0
        for start in range(0, max(len(pairs), 1), 2 * _CHUNK):
            merged = int(self._merge(keys=[key], args=[KEEP_SECONDS, "1", *pairs[start : start + 2 * _CHUNK]]))
        return merged
