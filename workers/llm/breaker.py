"""CircuitBreaker: one model's health shared by every worker through a Redis hash, so a dead model gets no calls.

The hash at ``name`` exists only while there is something to remember; a missing hash is a closed
breaker with no failures. Its fields:

- ``failures``: consecutive failures since the last success.
- ``open_until``: absent while closed; the Unix time the open period ends. From then on the
  breaker is half-open and one caller at a time may probe.
- ``open_seconds``: the current open period (the base, doubled by each failed probe, up to the max).
- ``probe_until``: when the lease of the probe in flight lapses. It is a field compared with the
  injected clock rather than a key with a Redis TTL, because Redis TTLs run on the server's clock.

Every transition is one Lua script, so it is atomic and costs one round trip.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal

import redis

from shared.state.keys import model_key

__all__ = ["BREAKER_WAIT_LUA", "BreakerState", "BreakerStatus", "CircuitBreaker", "breaker_key"]

BreakerStatus = Literal["closed", "open", "half_open"]

_PROBE_LEASE_SECONDS = 30.0
"""The shortest probe lease; a probe holds ``max(open period, this)`` so a dead prober blocks no one for long."""
_TTL_SECONDS = 24 * 3600
"""Every write refreshes the hash's TTL, so a model nobody calls any more leaves no key behind."""

BREAKER_WAIT_LUA = """
local function breaker_wait(key, now, lease, ttl)
  local h = redis.call('hmget', key, 'open_until', 'open_seconds', 'probe_until', 'failures')
  local open_until = tonumber(h[1])
  if not open_until then
    if h[4] then return '0' end
    return 'clean'
  end
  if now < open_until then return string.format('%.17g', open_until - now) end
  local period = tonumber(h[2])
  local probe_until = tonumber(h[3])
  if probe_until and now < probe_until then
    return string.format('%.17g', math.min(probe_until - now, period))
  end
  redis.call('hset', key, 'probe_until', string.format('%.17g', now + math.max(period, lease)))
  redis.call('expire', key, ttl)
  return '0'
end
"""
"""The breaker's leave for a call, as a Lua function (the limiter's script asks it too: ``workers.llm.limiter``):
``breaker_wait(the hash, now, the shortest probe lease, the TTL)`` is the seconds to wait, as a string because
Redis turns Lua numbers into integers, or ``'clean'``: go, and the breaker has nothing to remember (no hash),
so the call's success need not tell it (:attr:`~workers.llm.limiter.Slot.breaker_clean`). A closed breaker
costs one HMGET."""

# KEYS[1] the hash. ARGV: :meth:`CircuitBreaker.leave_args`.
_BEFORE_CALL = BREAKER_WAIT_LUA + "return breaker_wait(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3])"

# KEYS[1] the hash. ARGV: now, threshold, base period, max period, TTL. A failure while open (a call
# that started before the breaker opened) is only counted; one after the open period is a failed probe.
_RECORD_FAILURE = """
local h = redis.call('hmget', KEYS[1], 'open_until', 'open_seconds')
local open_until = tonumber(h[1])
local now = tonumber(ARGV[1])
local failures = redis.call('hincrby', KEYS[1], 'failures', 1)
local period = nil
if not open_until then
  if failures >= tonumber(ARGV[2]) then period = tonumber(ARGV[3]) end
elseif now >= open_until then
  period = math.min(tonumber(h[2]) * 2, tonumber(ARGV[4]))
end
if period then
  redis.call('hset', KEYS[1], 'open_until', string.format('%.17g', now + period),
             'open_seconds', string.format('%.17g', period))
  redis.call('hdel', KEYS[1], 'probe_until')
end
redis.call('expire', KEYS[1], ARGV[5])
return failures
"""


@dataclass(frozen=True, slots=True)
class BreakerState:
    """A snapshot of a breaker, for tests, metrics and logs."""

    status: BreakerStatus
    """``half_open`` once the open period has passed, whether or not a probe is in flight."""
    failures: int
    """Consecutive failures since the last success."""
    open_until: float
    """When the open period ends (Unix time); 0.0 while closed."""
    open_seconds: float
    """The current open period: the base while closed, doubled by each failed probe up to the max."""


class CircuitBreaker:
    """A circuit breaker for calls to one model, shared through Redis by every process that uses ``name``.

    Closed, calls go through and consecutive failures are counted. At ``failure_threshold`` it opens
    and callers wait. Once the open period passes it is half-open: one caller probes while the
    others wait; the probe's success closes the breaker and its failure re-opens it for twice as long.
    The clock is the caller's: every method takes ``now``. Redis errors propagate.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        name: str,
        failure_threshold: int = 5,
        open_seconds: float = 5.0,
        max_open_seconds: float = 60.0,
    ) -> None:
        """Bind the breaker to its hash; nothing is written until the first failure.

        Args:
            client: the Redis connection.
            name: the hash's key, from :func:`breaker_key`.
            failure_threshold: consecutive failures that open the breaker.
            open_seconds: the first open period.
            max_open_seconds: the longest open period failed probes can double it to.

        Raises:
            ValueError: a threshold below 1, a period that is not positive, or a max below the base.
        """
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, not {failure_threshold!r}")
        if not open_seconds > 0:
            raise ValueError(f"open_seconds must be positive, not {open_seconds!r}")
        if not max_open_seconds >= open_seconds:
            raise ValueError(
                f"max_open_seconds ({max_open_seconds!r}) must be at least open_seconds ({open_seconds!r})"
            )
        self._redis = client
        self._name = name
        self._threshold = failure_threshold
        self._open_seconds = open_seconds
        self._max_open_seconds = max_open_seconds
        # Outlive the longest open period plus its probe lease, even if that is longer than a day.
        self._ttl = max(_TTL_SECONDS, math.ceil(2 * max_open_seconds + _PROBE_LEASE_SECONDS))
        self._before_call = client.register_script(_BEFORE_CALL)
        self._record_failure = client.register_script(_RECORD_FAILURE)

    @property
    def name(self) -> str:
        """The Redis key of the breaker's hash."""
        return self._name

    def before_call(self, now: float) -> float:
        """Ask whether to call the model now. One round trip; a write only when it grants a probe.

        Args:
            now: the current Unix time.

        Returns:
            0.0: make the call (the breaker is closed, or this caller won the half-open probe and
            must report its outcome with :meth:`record_success` or :meth:`record_failure`);
            otherwise the seconds to wait before trying again (the breaker is open, or another
            caller's probe is in flight: the rest of its lease, capped at the open period).
        """
        wait = self._before_call(keys=[self._name], args=self.leave_args(now))
        return 0.0 if wait in (b"clean", "clean") else float(wait)

    def leave_args(self, now: float) -> list[str | int]:
        """The arguments of :data:`BREAKER_WAIT_LUA` but the hash's key (:attr:`name`), asked at ``now``."""
        return [repr(now), repr(_PROBE_LEASE_SECONDS), self._ttl]

    @property
    def client(self) -> redis.Redis:
        """The Redis connection the breaker's hash is on."""
        return self._redis

    def record_success(self, now: float) -> None:
        """Close the breaker and forget failures. One DEL, which writes nothing when there is nothing to forget.

        Any success closes it: the probe's, or that of a call that started before the breaker opened. A caller
        whose leave found the breaker clean (:attr:`~workers.llm.limiter.Slot.breaker_clean`) need not call
        this: a failure another caller counted meanwhile then stays counted, one failure nearer the threshold,
        until a success that saw it.

        Args:
            now: the current Unix time (unused: a closed breaker has no times to record).
        """
        self._redis.delete(self._name)

    def record_failure(self, now: float) -> None:
        """Count one failure (transport error, timeout, 5xx). One round trip.

        At ``failure_threshold`` consecutive failures the breaker opens for ``open_seconds``. A
        failure once the open period has passed is a failed probe: it re-opens the breaker for twice
        the previous period, up to ``max_open_seconds``. A failure while still open (a call that
        started before the breaker opened) is counted and changes nothing else.

        Args:
            now: the current Unix time.
        """
        self._record_failure(
            keys=[self._name],
            args=[repr(now), self._threshold, repr(self._open_seconds), repr(self._max_open_seconds), self._ttl],
        )

    def state(self, now: float) -> BreakerState:
        """Read the breaker as it stands at ``now``. One round trip, no write.

        Args:
            now: the current Unix time.

        Returns:
            The breaker's status, failures, end of open period and current open period.
        """
        failures, open_until, open_seconds = self._redis.hmget(self._name, ["failures", "open_until", "open_seconds"])
        if open_until is None:
            return BreakerState(
                status="closed", failures=int(failures or 0), open_until=0.0, open_seconds=self._open_seconds
            )
        until = float(open_until)
        return BreakerState(
            status="open" if now < until else "half_open",
            failures=int(failures or 0),
            open_until=until,
            open_seconds=float(open_seconds or self._open_seconds),
        )


def breaker_key(base_url: str, model: str) -> str:
    """The Redis key of the breaker for one model at one API root.

    Args:
        base_url: the API root; a trailing slash does not make another breaker.
        model: the model name.

    Returns:
        ``aptix:llm:{<16 hex digits of the SHA-1 of the URL and model>}:breaker`` (the limiter's tag).
    """
    digest = hashlib.sha1(f"{base_url.rstrip('/')}\n{model}".encode(), usedforsecurity=False).hexdigest()
    return model_key(digest[:16], "breaker")
