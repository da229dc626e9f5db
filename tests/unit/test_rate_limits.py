"""Model rate limits without Redis: the token estimate, where a model's limits come from, how llm_call
asks the limiter and tells it the outcome, and how the driver sends a held-back call again.

The limiter's buckets themselves (the Lua scripts) are tested on a real Redis:
tests/integration/test_rate_limiter_redis.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from shared.errors import ConfigurationError, LlmError
from shared.models.envelope import TurnEnvelope
from shared.modes import ModeCatalog, load_catalog
from shared.settings import Settings
from shared.task_names import StepName
from tests.unit.fakes import FakeLlm, drive, make_context, make_state, record_turn
from workers.context import BreakerPort, StepContext
from workers.driver import run_step
from workers.llm.limiter import OUTPUT_TOKENS_GUESS, Limits, Slot, estimate_tokens, limits_for
from workers.llm.types import LlmResponse
from workers.next_step import Continue, RetryAfter
from workers.retry import Trouble
from workers.steps import llm_call

REQUEST: dict[str, Any] = {"model": "m", "input": [{"role": "user", "content": "hello there"}], "store": False}


@dataclass
class RecordingLimiter:
    """A limiter that answers what it is told to and records what llm_call told it."""

    answer: Slot = field(default_factory=lambda: Slot(tokens=100))
    paced: list[dict[str, Any]] = field(default_factory=list)
    settled: list[tuple[Slot, int, bool]] = field(default_factory=list)
    paused: list[float] = field(default_factory=list)

    def pace(self, request: dict[str, Any], breaker: BreakerPort | None = None, *, at: float = 0.0) -> Slot:
        self.paced.append(request)
        wait = 0.0 if self.answer.wait > 0 or breaker is None else breaker.before_call(at)
        return Slot(breaker_wait=wait) if wait > 0 else self.answer  # the port's contract: nothing charged then

    def settle(self, slot: Slot, *, used: int, called: bool = True) -> None:
        self.settled.append((slot, used, called))

    def pause(self, seconds: float) -> float:
        self.paused.append(seconds)
        return seconds


def _with_limiter(ctx: StepContext, limiter: RecordingLimiter) -> StepContext:
    return replace(ctx, limiter=lambda model: limiter)


def _env() -> TurnEnvelope:
    return TurnEnvelope(turn_id="turn_" + "0" * 32, step=StepName.LLM_CALL, iteration=1)


# --- the estimate ---------------------------------------------------------------------------------


def test_estimate_is_a_quarter_of_the_request_json_plus_the_output_guess() -> None:
    size = len(json.dumps(REQUEST, separators=(",", ":")))
    assert estimate_tokens(REQUEST) == -(-size // 4) + OUTPUT_TOKENS_GUESS


def test_estimate_reserves_max_output_tokens_when_the_request_names_it() -> None:
    bounded = {**REQUEST, "max_output_tokens": 50}
    size = len(json.dumps(bounded, separators=(",", ":")))
    assert estimate_tokens(bounded) == -(-size // 4) + 50


@pytest.mark.parametrize("bound", [True, 0, -5, "100", None])
def test_estimate_falls_back_to_the_guess_when_max_output_tokens_is_not_a_positive_int(bound: object) -> None:
    request = {**REQUEST, "max_output_tokens": bound}
    size = len(json.dumps(request, separators=(",", ":")))
    assert estimate_tokens(request) == -(-size // 4) + OUTPUT_TOKENS_GUESS


def test_estimate_grows_with_the_input() -> None:
    long = {**REQUEST, "input": [{"role": "user", "content": "word " * 4000}]}
    assert estimate_tokens(long) - estimate_tokens(REQUEST) >= 4000 * 5 // 4 - 10


# --- where limits come from ----------------------------------------------------------------------


def _catalog(models: dict[str, Any] | None = None) -> ModeCatalog:
    raw: dict[str, Any] = {"modes": [{"name": "general"}]}
    if models is not None:
        raw["models"] = models
    return ModeCatalog.model_validate(raw)


def test_configured_model_takes_its_limits_from_the_environment() -> None:
    settings = Settings(llm_model="main", llm_rpm=300, llm_tpm=90_000)
    assert limits_for("main", settings=settings, catalog=_catalog()) == Limits(rpm=300, tpm=90_000)


def test_other_models_have_no_limits_without_a_catalog_entry() -> None:
    settings = Settings(llm_model="main", llm_rpm=300, llm_tpm=90_000)
    assert limits_for("other", settings=settings, catalog=_catalog()) == Limits()


def test_catalog_entry_overrides_the_environment_limit_by_limit() -> None:
    settings = Settings(llm_model="main", llm_rpm=300, llm_tpm=90_000)
    catalog = _catalog({"main": {"rpm": 60}, "other": {"tpm": 1000}})
    assert limits_for("main", settings=settings, catalog=catalog) == Limits(rpm=60, tpm=90_000)
    assert limits_for("other", settings=settings, catalog=catalog) == Limits(rpm=None, tpm=1000)


def test_unset_or_empty_environment_limits_mean_no_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APTIX_LLM_RPM", "")
    monkeypatch.delenv("APTIX_LLM_TPM", raising=False)
    settings = Settings()
    assert (settings.llm_rpm, settings.llm_tpm) == (None, None)


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_environment_limit_that_is_not_a_positive_integer_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("APTIX_LLM_RPM", value)
    with pytest.raises(ValidationError, match="llm_rpm"):
        Settings()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({}, "needs rpm, tpm or both"),
        ({"rpm": 0}, "greater than 0"),
        ({"tpm": "lots"}, "valid integer"),
        ({"rpm": 10, "burst": 5}, "Extra inputs are not permitted"),
    ],
)
def test_catalog_with_a_bad_models_entry_is_refused_at_load(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    path = tmp_path / "modes.yaml"
    path.write_text(yaml.safe_dump({"modes": [{"name": "general"}], "models": {"gpt-x": entry}}))
    with pytest.raises(ConfigurationError, match=message):
        load_catalog(path)


def test_catalog_models_section_loads_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "modes.yaml"
    path.write_text(yaml.safe_dump({"modes": [{"name": "general"}], "models": {"ft:gpt-x:org": {"rpm": 10}}}))
    assert load_catalog(path).models["ft:gpt-x:org"].rpm == 10


# --- llm_call and the limiter --------------------------------------------------------------------


def test_llm_call_makes_no_call_and_asks_for_its_slot_when_the_rate_limit_holds_it_back() -> None:
    limiter = RecordingLimiter(Slot(wait=1.25, reason="requests"))
    llm = FakeLlm()
    ctx = _with_limiter(make_context(llm), limiter)
    result = llm_call.run(ctx, _env(), make_state(pending_request=REQUEST))
    later = result.unwrap()
    assert later == RetryAfter(Trouble.MODEL_PACED, later.message, hint=1.25)
    assert llm.requests == [] and limiter.settled == []
    held = ctx.metrics.registry.get_sample_value("aptix_model_rate_limited_total", {"model": "m", "reason": "requests"})
    assert held == 1


def test_llm_call_waits_out_a_pause_like_a_429_not_as_a_paced_slot() -> None:
    limiter = RecordingLimiter(Slot(wait=1.5, reason="paused"))
    ctx = _with_limiter(make_context(FakeLlm()), limiter)
    later = llm_call.run(ctx, _env(), make_state(pending_request=REQUEST)).unwrap()
    assert later == RetryAfter(Trouble.MODEL_PAUSED, later.message, hint=1.5)


def test_llm_call_settles_with_the_tokens_the_answer_reports() -> None:
    limiter = RecordingLimiter()
    ctx = _with_limiter(make_context(FakeLlm(LlmResponse(response_id="r", output_text="hi", input_tokens=30,
                                                         output_tokens=12))), limiter)  # fmt: skip
    result = llm_call.run(ctx, _env(), make_state(pending_request=REQUEST))
    assert result.unwrap() == Continue(StepName.REASONER, 1)
    assert limiter.paced == [REQUEST] and limiter.settled == [(limiter.answer, 42, True)]


@pytest.mark.parametrize("clean", [False, True])
def test_llm_call_tells_the_breaker_of_a_success_unless_its_leave_found_it_clean(clean: bool) -> None:
    limiter = RecordingLimiter(Slot(tokens=100, breaker_clean=clean))
    ctx = _with_limiter(make_context(FakeLlm(LlmResponse(response_id="r", output_text="hi"))), limiter)
    breaker = ctx.breaker("m")
    breaker.record_failure(0.0)  # what the breaker remembers; a clean leave says there was nothing
    llm_call.run(ctx, _env(), make_state(pending_request=REQUEST))
    assert breaker.state(1.0).failures == (1 if clean else 0)


def test_llm_call_keeps_the_estimate_when_the_answer_reports_no_usage() -> None:
    limiter = RecordingLimiter()
    ctx = _with_limiter(make_context(FakeLlm(LlmResponse(response_id="r", output_text="hi"))), limiter)
    llm_call.run(ctx, _env(), make_state(pending_request=REQUEST))
    assert limiter.settled == [(limiter.answer, 100, True)]


def test_llm_call_pauses_the_model_for_every_worker_on_a_429_with_retry_after() -> None:
    limiter = RecordingLimiter()
    llm = FakeLlm(LlmError("slow down", status_code=429, retryable=True, retry_after=2.0))
    ctx = _with_limiter(make_context(llm), limiter)
    later = llm_call.run(ctx, _env(), make_state(pending_request=REQUEST)).unwrap()
    assert isinstance(later, RetryAfter) and later.trouble is Trouble.MODEL_RATE_LIMITED and later.hint == 2.0
    assert limiter.paused == [2.0] and limiter.settled == [(limiter.answer, 0, True)]


@pytest.mark.parametrize(
    ("error", "paused", "settled"),
    [
        (LlmError("slow down", status_code=429, retryable=True), [], True),  # no Retry-After: no pause
        (LlmError("down", status_code=503, retryable=True, retry_after=3.0), [], True),  # not a 429
        (LlmError("timeout", status_code=0, retryable=True), [], False),  # no answer: it may have run
    ],
)
def test_llm_call_gives_back_tokens_of_error_answers_and_pauses_only_on_429_retry_after(
    error: LlmError, paused: list[float], settled: bool
) -> None:
    limiter = RecordingLimiter()
    ctx = _with_limiter(make_context(FakeLlm(error)), limiter)
    llm_call.run(ctx, _env(), make_state(pending_request=REQUEST))
    assert limiter.paused == paused
    assert limiter.settled == ([(limiter.answer, 0, True)] if settled else [])


def test_llm_call_asks_the_breaker_through_the_limiter_and_settles_nothing_when_it_stops_the_call() -> None:
    limiter = RecordingLimiter()
    llm = FakeLlm(*[LlmError("down", status_code=503, retryable=True) for _ in range(2)])
    ctx = _with_limiter(make_context(llm, llm_breaker_failures=2), limiter)
    for _ in range(2):
        llm_call.run(ctx, _env(), make_state(pending_request=REQUEST))
    limiter.settled.clear()
    later = llm_call.run(ctx, _env(), make_state(pending_request=REQUEST)).unwrap()
    assert isinstance(later, RetryAfter) and later.trouble is Trouble.MODEL_BREAKER_OPEN and len(llm.requests) == 2
    assert later.hint is not None and later.hint > 0 and limiter.settled == []


# --- the driver ----------------------------------------------------------------------------------


def test_driver_sends_a_held_back_call_again_after_exactly_its_slot_without_spending_the_budget() -> None:
    # Given a turn whose model call the rate limit holds back for longer than the whole retry budget
    limiter = RecordingLimiter(Slot(wait=400.0, reason="tokens"))
    ctx = _with_limiter(make_context(FakeLlm(), llm_retry_budget_seconds=300), limiter)
    env = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope

    # When the llm_call step runs
    dispatch = run_step(ctx, env)

    # Then the same step is sent again after exactly the limiter's wait (no jitter), and the turn
    # has not started a model retry (no budget, no attempts spent)
    assert dispatch is not None and dispatch.failed is None
    assert dispatch.envelope.step_key == env.step_key and dispatch.envelope.attempt == env.attempt + 1
    assert dispatch.countdown == 400.0
    state = ctx.states.load(env.turn_id)
    assert state is not None and state.model_retry is None
    retried = ctx.metrics.registry.get_sample_value("aptix_step_retries_total", {"reason": "model", "step": "llm_call"})
    assert retried == 0  # counted as held back (aptix_model_rate_limited_total), not as a model failure


def test_driver_completes_the_turn_once_its_slot_comes() -> None:
    limiter = RecordingLimiter(Slot(wait=0.2, reason="requests"))
    ctx = _with_limiter(make_context(FakeLlm(LlmResponse(response_id="r", output_text="done"))), limiter)
    env = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    held = run_step(ctx, env)
    assert held is not None and held.envelope.step is StepName.LLM_CALL
    limiter.answer = Slot(tokens=10)
    drive(ctx, held.envelope)
    row = ctx.turns.get(env.turn_id)
    assert row is not None and row.status == "completed" and row.output_text == "done"
