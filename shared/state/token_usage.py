"""TokenUsage: the tokens each organisation's turns used per UTC day, counted in Redis for the daily budget.

A hash per organisation and day (``org_tokens_key``; the day a turn was created): a field per turn
holding its tokens (input + output) as last committed, and ``total``, their sum. A commit *merges*
its turn's count (one Lua script): the field takes the larger of the two and
``total`` the difference, so a commit that runs twice counts once, and the count of a turn only
grows, as its usage does. The same merge seeds a day Redis has no count of (lost, or begun before
this code ran) from the database (``shared.db.usage``), turn by turn, then marks it ``seeded``: a
commit that lands between the database read and the seed is neither lost nor counted twice. So the
``total`` is the sum of the turns' committed usage, which ``GET /v1/usage`` sums too.

A worker's commit does not merge by itself: it says what to merge (:class:`TurnTokens`), and the save
that ends the turn's chain sends the merge in the same round trip (:func:`merge_calls`, pipelined by
``RedisStateStore.save``). A worker that dies between its commit and that save leaves its turn short
until its next commit (or a seed): the commit a redelivery makes finds a finished turn ended and writes nothing.

The scripts build no keys: one Redis, no cluster, like every Aptix Lua script.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date

import redis

from shared.state.keys import org_tokens_key
from shared.state.scripts import ScriptCall

__all__ = ["KEEP_SECONDS", "TokenUsage", "TurnTokens", "merge_calls"]

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


@dataclass(frozen=True, slots=True)
class TurnTokens:
    """A turn's tokens so far (input + output) as its commit wrote them, for its organisation's count of ``day``
    (the UTC day the turn was created)."""

    org_id: str
    day: date
    turn_id: str
    tokens: int


def merge_calls(client: redis.Redis) -> Callable[[TurnTokens], list[ScriptCall]]:
    """What merges a turn's committed tokens into its organisation's count of the day, as calls for
    :func:`~shared.state.scripts.pipelined` (none for a turn that used no tokens)."""
    script = client.register_script(_MERGE)

    def calls(used: TurnTokens) -> list[ScriptCall]:
        if used.tokens <= 0:
            return []
        key = org_tokens_key(used.org_id, used.day.isoformat())
        return [ScriptCall(script, [key], [KEEP_SECONDS, "0", used.turn_id, used.tokens])]

    return calls


class TokenUsage:
    """Per-organisation daily token counts on the state store's Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._merge = client.register_script(_MERGE)

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
