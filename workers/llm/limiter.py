"""RateLimiter: a model's requests and tokens per minute, shared by every worker process and host through Redis.

Each model (at one API root) has one hash with two GCRA buckets, each kept as a "theoretical
arrival time" (TAT): the time by which every call let through so far is paid for at the limit's
pace. A call goes when both TATs are at most :data:`BURST_SECONDS` ahead of now; it then pushes
the requests TAT by ``60/rpm`` s and the tokens TAT by ``tokens * 60/tpm`` s. So calls are spread
evenly rather than let through in per-minute lumps: any window of W seconds sees at most
``rpm * (W + BURST_SECONDS) / 60 + 1`` requests, and at most ``tpm * (W + BURST_SECONDS) / 60``
tokens plus one call's. A call bigger than a bucket can still go once the bucket has paid off
everything before it (there is no bucket size it could exceed).

The hash's fields:

- ``requests`` / ``tokens``: the two TATs (Unix time, the Redis server's clock).
- ``line``: the slot the next held-back call is given. A call that may not go now is told to come
  back at a slot of its own: the first after the bucket frees up, one call's share after the
  previous held-back call's. Callers told "later" thus come back one by one instead of all at
  once; a slot is a hint, and the call is checked again when it comes back.

Beside the hash, one string key holds the end of a pause: a 429 answer with ``Retry-After`` (or
``retry-after-ms``) pauses the model for every worker that long (:meth:`RateLimiter.pause`), with
or without rpm/tpm limits.

Tokens: a call reserves an estimate before it is made (:func:`estimate_tokens`) and settles with
the answer's ``usage`` after (:meth:`RateLimiter.settle`): the tokens TAT moves back by what was
reserved but not used, or on by what was used beyond the estimate.

The clock is the Redis server's (``TIME`` inside the scripts): every host then sees one clock, and
a host whose clock is off by 100 ms does not break a 200 ms spacing. Tests may pass ``now``.
Every operation is one Lua script, so it is atomic and costs one round trip.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import redis

from shared.modes import ModeCatalog
from shared.settings import Settings
from shared.state.keys import model_key
from workers.llm.breaker import BREAKER_WAIT_LUA, CircuitBreaker

__all__ = [
    "BURST_SECONDS",
    "MAX_PAUSE_SECONDS",
    "OUTPUT_TOKENS_GUESS",
    "BreakerLeave",
    "HoldReason",
    "Limits",
    "RateLimiter",
    "Slot",
    "Unlimited",
    "estimate_tokens",
    "limiter_keys",
    "limits_for",
]

BURST_SECONDS = 0.05
"""How far ahead of the limits' pace a call may go: a call goes when both buckets are paid off to
within this. Without it a caller a few ms late for its slot would lose it to one a few ms early; with
it, at 300 requests a minute, any one-second window still sees at most 6 requests."""
OUTPUT_TOKENS_GUESS = 1024
"""The output tokens a call reserves when its request names no ``max_output_tokens``."""
MAX_PAUSE_SECONDS = 300.0
"""The longest pause a Retry-After can ask for; a longer one pauses this long (a broken proxy must
not stop a model for a day)."""
_CHARS_PER_TOKEN = 4
"""The input estimate: a token per four characters of the request's JSON (English text is about
four characters a token; JSON's punctuation makes this an over-estimate, which settling gives back)."""
_IDLE_TTL_SECONDS = 3600
"""The hash outlives its last TAT by this, so a call slower than that settles into the same hash."""

logger = logging.getLogger(__name__)

HoldReason = Literal["requests", "tokens", "paused"]
"""Why a call may not go now: the requests bucket, the tokens bucket, or a provider's Retry-After."""

# Every script reads the clock the same way, and writes numbers with all their digits (Redis turns
# a Lua number into an integer on the way out).
_PRELUDE = """
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('time')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function num(x) return string.format('%.17g', x) end
"""

# acquire(the hash, the pause key, seconds per request (0: no rpm), seconds per token (0: no tpm), tokens, burst
# seconds, idle TTL, leave): {wait, reason} with wait '0' (reason 'ok') when the call goes (and is charged), else the
# seconds until its slot. ``leave`` (or nil) is asked once the limits let the call go, before it is charged: a wait
# it answers other than '0' or 'clean' is returned as {'0', 'breaker', that wait}, nothing charged; a call that
# goes carries its answer third ({'0', 'ok', '0' or 'clean'}).
_ACQUIRE_FUNCTION = """
local function acquire(hash, pause_key, per_request, per_token, tokens, burst, idle_ttl, leave)
  local cost = tokens * per_token
  local paused = tonumber(redis.call('get', pause_key)) or 0
  local h = redis.call('hmget', hash, 'requests', 'tokens', 'line')
  local requests, tokens_at, line = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0
  local ready, reason = paused, 'paused'
  if requests - burst > ready then ready, reason = requests - burst, 'requests' end
  if tokens_at - burst > ready then ready, reason = tokens_at - burst, 'tokens' end
  if ready <= now then
    local went = {'0', 'ok'}
    if leave then
      local wait = leave()
      if wait ~= '0' and wait ~= 'clean' then return {'0', 'breaker', wait} end
      went[3] = wait
    end
    if per_request == 0 and cost == 0 then return went end
    requests = math.max(requests, now) + per_request
    tokens_at = math.max(tokens_at, now) + cost
    redis.call('hset', hash, 'requests', num(requests), 'tokens', num(tokens_at))
    redis.call('expire', hash, math.ceil(math.max(requests, tokens_at, line) - now) + idle_ttl)
    return went
  end
  local slot = math.max(ready, line)
  line = slot + math.max(per_request, cost)
  redis.call('hset', hash, 'line', num(line))
  redis.call('expire', hash, math.ceil(math.max(requests, tokens_at, line) - now) + idle_ttl)
  return {num(slot - now), reason}
end
"""

# KEYS[1] the hash, KEYS[2] the pause key. ARGV: now ('' for the server's clock), seconds per request, seconds per
# token, tokens, burst seconds, idle TTL.
_ACQUIRE_ARGS = "tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])"
_ACQUIRE = _PRELUDE + _ACQUIRE_FUNCTION + f"return acquire(KEYS[1], KEYS[2], {_ACQUIRE_ARGS}, nil)"

# The same with the model's circuit breaker asked too (``CircuitBreaker.before_call``): KEYS[3] its hash, ARGV[7:10]
# its arguments (``CircuitBreaker.leave_args``). One round trip where the two are two.
_ACQUIRE_WITH_LEAVE = (
    _PRELUDE
    + _ACQUIRE_FUNCTION
    + BREAKER_WAIT_LUA
    + f"""
local function leave() return breaker_wait(KEYS[3], tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]) end
return acquire(KEYS[1], KEYS[2], {_ACQUIRE_ARGS}, leave)
"""
)

# KEYS[1] the hash. ARGV: now (''), seconds per request to give back (0: none), seconds of tokens to
# add (negative: to give back), idle TTL. Giving back what an expired hash no longer holds is a no-op.
_SETTLE = (
    _PRELUDE
    + """
local refund, extra = tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('hmget', KEYS[1], 'requests', 'tokens', 'line')
local requests, tokens, line = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]) or 0
if requests and refund > 0 then requests = requests - refund end
if extra > 0 then
  tokens = math.max(tokens or 0, now) + extra
elseif tokens then
  tokens = tokens + extra
end
if not requests and not tokens then return 0 end
requests, tokens = requests or 0, tokens or 0
redis.call('hset', KEYS[1], 'requests', num(requests), 'tokens', num(tokens))
redis.call('expire', KEYS[1], math.max(1, math.ceil(math.max(requests, tokens, line) - now) + tonumber(ARGV[4])))
return 1
"""
)

# KEYS[1] the pause key. ARGV: now (''), seconds. A pause never shortens a longer one. Returns its end.
_PAUSE = (
    _PRELUDE
    + """
local current = tonumber(redis.call('get', KEYS[1])) or 0
local ends = now + tonumber(ARGV[2])
if ends <= current then return num(current) end
redis.call('set', KEYS[1], num(ends), 'px', math.ceil(tonumber(ARGV[2]) * 1000) + 1000)
return num(ends)
"""
)


@dataclass(frozen=True, slots=True)
class Limits:
    """One model's limits, resolved from the settings and the catalog (None: no limit)."""

    rpm: int | None = None
    """Requests per minute, across every worker."""
    tpm: int | None = None
    """Tokens per minute (input + output), across every worker."""


@dataclass(frozen=True, slots=True)
class Slot:
    """The limiter's answer to one call, its slot: go now, or come back after ``wait`` seconds."""

    wait: float = 0.0
    """0.0: make the call (it is charged); otherwise the seconds until this call's slot."""
    tokens: int = 0
    """The tokens reserved for the call (settle them with :meth:`RateLimiter.settle`); 0 when held back
    or when the model has no tokens limit."""
    reason: HoldReason | None = None
    """Why the call was held back; None when it goes."""
    breaker_wait: float = 0.0
    """The seconds the model's circuit breaker asked to wait (the limits let the call go, and nothing was charged);
    0.0 when it gave its leave or was not asked."""
    breaker_clean: bool = False
    """The breaker gave its leave with nothing to remember (no failures, no probe): the call's success need not
    tell it (:meth:`~workers.llm.breaker.CircuitBreaker.record_success`, a round trip). False when it was not asked
    in the same script."""


class BreakerLeave(Protocol):
    """What :meth:`RateLimiter.pace` asks of a model's circuit breaker (``workers.llm.breaker.CircuitBreaker``)."""

    def before_call(self, now: float) -> float:
        """0 to call now, else the seconds to wait."""


class RateLimiter:
    """The shared rate limits of one model: ``pace`` before a call, ``settle`` after, ``pause`` on a 429.

    Redis errors from ``pace`` propagate: no call was made, and the driver runs the step again later
    as for any Redis blip. ``settle`` and ``pause`` come after a call was made, so they log a Redis
    error and return: the step must not run again and ask the model twice. The buckets are then off by
    one call's estimate, or the pause is this worker's own.
    """

    def __init__(self, client: redis.Redis, *, name: str, pause_name: str, limits: Limits) -> None:
        """Bind the limiter to its keys; nothing is written until a call is let through or held back.

        Args:
            client: the Redis connection.
            name: the buckets' hash (:func:`limiter_keys`).
            pause_name: the pause key (:func:`limiter_keys`).
            limits: the model's limits.
        """
        self._redis = client
        self._keys = [name, pause_name]
        self.limits = limits
        """The model's limits."""
        self._per_request = 60.0 / limits.rpm if limits.rpm else 0.0
        self._per_token = 60.0 / limits.tpm if limits.tpm else 0.0
        self._acquire = client.register_script(_ACQUIRE)
        self._acquire_with_leave = client.register_script(_ACQUIRE_WITH_LEAVE)
        self._settle = client.register_script(_SETTLE)
        self._pause = client.register_script(_PAUSE)

    def pace(
        self,
        request: Mapping[str, Any],
        breaker: BreakerLeave | None = None,
        *,
        at: float = 0.0,
        now: float | None = None,
    ) -> Slot:
        """Let a call with this request body go now, or say when to try again. One round trip.

        Args:
            request: the Responses API request the call would send (for its token estimate).
            breaker: the model's circuit breaker, asked (at ``at``, its clock's Unix time) once the limits let
                the call go: when it says wait (:attr:`Slot.breaker_wait`), nothing is charged. A
                :class:`~workers.llm.breaker.CircuitBreaker` on the limiter's connection is asked in the same
                script, so the round trip is still one.
            now: the Unix time of the limits; None for the Redis server's clock.

        Returns:
            The slot: ``wait`` 0 and the reserved tokens, or the wait and its reason, or the breaker's wait.
        """
        tokens = estimate_tokens(request) if self.limits.tpm else 0
        if isinstance(breaker, CircuitBreaker) and breaker.client is self._redis:
            keys = [*self._keys, breaker.name]
            args = [*self._args(tokens, now), *breaker.leave_args(at)]
            return _slot(self._acquire_with_leave(keys=keys, args=args), tokens)
        slot = self.acquire(tokens, now=now)
        if breaker is None or slot.wait > 0:
            return slot
        wait = breaker.before_call(at)
        if wait <= 0:
            return slot
        self.settle(slot, used=0, called=False, now=now)
        return Slot(breaker_wait=wait)

    def acquire(self, tokens: int, *, now: float | None = None) -> Slot:
        """Let a call of ``tokens`` (estimated) go now, or say when to try again. One round trip.

        Args:
            tokens: the tokens to reserve (ignored without a tokens limit).
            now: the Unix time; None for the Redis server's clock.

        Returns:
            The slot.
        """
        tokens = tokens if self.limits.tpm else 0
        return _slot(self._acquire(keys=self._keys, args=self._args(tokens, now)), tokens)

    def _args(self, tokens: int, now: float | None) -> list[str | int]:
        return [
            _now(now),
            repr(self._per_request),
            repr(self._per_token),
            tokens,
            repr(BURST_SECONDS),
            _IDLE_TTL_SECONDS,
        ]

    def settle(self, slot: Slot, *, used: int, called: bool = True, now: float | None = None) -> None:
        """Correct a let-through call's charge once its outcome is known. At most one round trip.

        Args:
            slot: what :meth:`acquire` answered (nothing to settle for a held-back call).
            used: the tokens the call used (input + output from the answer's ``usage``; 0 for an error
                answer). The estimate's surplus is given back, or the shortfall taken.
            called: False when the call was not made after all (the model's breaker was open): its
                request is given back too.
            now: the Unix time; None for the Redis server's clock.
        """
        if slot.wait > 0:
            return
        refund = self._per_request if not called else 0.0
        extra = (used - slot.tokens) * self._per_token
        if refund == 0 and extra == 0:
            return
        try:
            self._settle(keys=self._keys[:1], args=[_now(now), repr(refund), repr(extra), _IDLE_TTL_SECONDS])
        except redis.RedisError as exc:
            logger.warning("could not settle a model call's rate-limit charge (%s); it stands as estimated", exc)

    def pause(self, seconds: float, *, now: float | None = None) -> float:
        """Stop every worker's calls to this model for ``seconds`` (a provider's Retry-After). One round trip.

        Args:
            seconds: how long; at most :data:`MAX_PAUSE_SECONDS` is applied.
            now: the Unix time; None for the Redis server's clock.

        Returns:
            When the pause ends (Unix time; a longer pause already set is kept); 0.0 when Redis could
            not be told (the step's own retry still waits).
        """
        seconds = min(max(seconds, 0.0), MAX_PAUSE_SECONDS)
        try:
            return float(self._pause(keys=self._keys[1:], args=[_now(now), repr(seconds)]))
        except redis.RedisError as exc:
            logger.warning("could not pause the model for every worker (%s); only this call waits", exc)
            return 0.0


class Unlimited:
    """A limiter that lets every call go and forgets pauses: the default of a bare StepContext (unit tests)."""

    def pace(self, request: Mapping[str, Any], breaker: BreakerLeave | None = None, *, at: float = 0.0) -> Slot:
        """Let the call go, if ``breaker`` (asked at ``at``) gives its leave."""
        wait = 0.0 if breaker is None else breaker.before_call(at)
        return Slot(breaker_wait=wait) if wait > 0 else Slot()

    def settle(self, slot: Slot, *, used: int, called: bool = True) -> None:
        """Nothing was charged."""

    def pause(self, seconds: float) -> float:
        """Nothing is shared; no pause is kept."""
        return 0.0


def estimate_tokens(request: Mapping[str, Any]) -> int:
    """The tokens a call reserves before it is made: its input's estimate plus its output's bound.

    Input: a quarter of the length of the request's JSON (instructions, input items and tools: all
    of them count as input tokens), rounded up. Output: the request's ``max_output_tokens``, else
    :data:`OUTPUT_TOKENS_GUESS`. Settling with the answer's ``usage`` corrects the estimate.

    Args:
        request: the Responses API request body.

    Returns:
        The estimate, at least 1.
    """
    size = len(json.dumps(request, ensure_ascii=False, separators=(",", ":"), default=str))
    bound = request.get("max_output_tokens")
    output = bound if isinstance(bound, int) and not isinstance(bound, bool) and bound > 0 else OUTPUT_TOKENS_GUESS
    return math.ceil(size / _CHARS_PER_TOKEN) + output


def limits_for(model: str, *, settings: Settings, catalog: ModeCatalog) -> Limits:
    """A model's limits: its ``models:`` entry in the catalog, else ``APTIX_LLM_RPM``/``TPM`` for the configured model.

    Each of rpm and tpm is taken from the catalog entry when it sets it; otherwise, for the configured
    model (``APTIX_LLM_MODEL``), from the environment; otherwise there is none.

    Args:
        model: the model name a request carries.
        settings: ``llm_model``, ``llm_rpm`` and ``llm_tpm``.
        catalog: the mode catalog and its ``models`` section.

    Returns:
        The resolved limits.
    """
    entry = catalog.models.get(model)
    configured = model == settings.llm_model
    rpm = entry.rpm if entry is not None and entry.rpm is not None else (settings.llm_rpm if configured else None)
    tpm = entry.tpm if entry is not None and entry.tpm is not None else (settings.llm_tpm if configured else None)
    return Limits(rpm=rpm, tpm=tpm)


def limiter_keys(base_url: str, model: str) -> tuple[str, str]:
    """The Redis keys of one model's limiter at one API root: its buckets' hash and its pause key.

    Args:
        base_url: the API root; a trailing slash does not make another limiter.
        model: the model name.

    Returns:
        ``aptix:llm:{<digest>}:limit`` and ``aptix:llm:{<digest>}:pause``, the digest being 16 hex digits
        of the SHA-1 of the URL and model (the breaker's); its hash tag puts both in one cluster slot.
    """
    digest = hashlib.sha1(f"{base_url.rstrip('/')}\n{model}".encode(), usedforsecurity=False).hexdigest()[:16]
    return model_key(digest, "limit"), model_key(digest, "pause")


def _now(now: float | None) -> str:
    return "" if now is None else repr(now)


def _slot(reply: list[bytes], tokens: int) -> Slot:
    """The slot of an acquire script's reply, for a call that reserved ``tokens``."""
    wait, reason, *leave = reply
    if reason in (b"breaker", "breaker"):
        return Slot(breaker_wait=float(leave[0]))
    seconds = float(wait)
    if seconds > 0:
        return Slot(wait=seconds, reason=_reason(reason))
    return Slot(tokens=tokens, breaker_clean=bool(leave) and leave[0] in (b"clean", "clean"))


def _reason(raw: bytes | str) -> HoldReason:
    text = raw.decode() if isinstance(raw, bytes) else raw
    if text == "requests":
        return "requests"
    if text == "tokens":
        return "tokens"
    return "paused"
