"""The one retry policy: the table itself, then each wait, budget and give-up, and how troubles are named."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import redis
from sqlalchemy.exc import OperationalError

from shared.broker import visibility_timeout
from shared.errors import LlmError, StateConflict, StepBusy, TurnNotRecorded
from shared.result import ErrorCode, ErrorInfo
from shared.settings import Settings
from shared.state import ModelRetry
from tests.unit.fakes import FIXED_NOW
from workers import retry
from workers.retry import Drop, GiveUp, Later, Reason, Trouble

SETTINGS = Settings(step_lease_seconds=30, reconciler_max_redrives=5)
STEP = "0:4:llm_call:1"

# What each trouble gets on its first try (told to wait 8 s, jitter at its least) and once its budget is
# spent: the table of workers/retry.py's docstring, as the policy answers it.
# fmt: off
TABLE: dict[Trouble, tuple[float, Reason | None, ErrorCode | str | None]] = {
    #  trouble                        first wait  counted as                 once spent (a code; "drop"; None: never)
    Trouble.MODEL_RATE_LIMITED:    (8.0,  Reason.MODEL,              ErrorCode.LLM_RATE_LIMITED),
    Trouble.MODEL_ERROR:           (8.0,  Reason.MODEL,              ErrorCode.LLM_ERROR),
    Trouble.MODEL_UNREACHABLE:     (8.0,  Reason.MODEL,              ErrorCode.LLM_ERROR),
    Trouble.MODEL_PAUSED:          (8.0,  Reason.MODEL,              ErrorCode.LLM_RATE_LIMITED),
    Trouble.MODEL_BREAKER_OPEN:    (8.0,  Reason.MODEL,              ErrorCode.LLM_ERROR),
    Trouble.MODEL_PACED:           (8.0,  None,                      None),
    Trouble.MODEL_REJECTED:        (-1,   None,                      ErrorCode.LLM_ERROR),
    Trouble.MODEL_QUOTA_EXHAUSTED: (-1,   None,                      ErrorCode.LLM_RATE_LIMITED),
    Trouble.STEP_BUSY:             (15.0, Reason.STEP_BUSY,          None),
    Trouble.TURN_NOT_RECORDED:     (0.01, Reason.TURN_NOT_RECORDED,  "drop"),
    Trouble.INFRASTRUCTURE:        (0.25, Reason.INFRASTRUCTURE,     None),
    Trouble.STALLED:               (0.0,  None,                      ErrorCode.INTERNAL_ERROR),
}
"""-1: no wait, the trouble gives up at once."""
# fmt: on


def _decide(
    trouble: Trouble,
    *,
    settings: Settings = SETTINGS,
    now: datetime = FIXED_NOW,
    rand: float = 0.0,
    attempt: int = 0,
    hint: float | None = None,
    message: str = "m",
    model_retry: ModelRetry | None = None,
) -> retry.Decision:
    return retry.decide(trouble, settings=settings, now=now, rand=rand, attempt=attempt, hint=hint, message=message,
                        step_key=STEP, model_retry=model_retry)  # fmt: skip


def _spent(trouble: Trouble) -> retry.Decision:
    """The decision once ``trouble``'s budget is spent, however it is counted."""
    long_ago = ModelRetry(step_key=STEP, since=FIXED_NOW - timedelta(days=1), calls=SETTINGS.llm_max_attempts)
    return _decide(trouble, attempt=1000, model_retry=long_ago)


def test_policy_has_a_row_for_every_trouble() -> None:
    assert set(retry.POLICY) == set(Trouble) == set(TABLE)


@pytest.mark.parametrize("trouble", list(Trouble))
def test_policy_answers_each_trouble_as_its_table_row_says(trouble: Trouble) -> None:
    first_wait, counted_as, once_spent = TABLE[trouble]
    first = _decide(trouble, hint=8.0)
    if first_wait < 0:
        assert isinstance(once_spent, ErrorCode) and first == GiveUp(ErrorInfo(code=once_spent, message="m"))
    else:
        assert isinstance(first, Later) and first.counted_as is counted_as
        assert first.seconds == pytest.approx(first_wait)
    spent = _spent(trouble)
    if once_spent is None:
        assert isinstance(spent, Later)
    elif once_spent == "drop":
        assert isinstance(spent, Drop)
    else:
        assert isinstance(spent, GiveUp) and spent.error.code is once_spent


def test_only_troubles_that_say_the_model_is_down_count_against_its_breaker() -> None:
    assert {Trouble.MODEL_ERROR, Trouble.MODEL_UNREACHABLE} == retry.MODEL_DOWN


def test_only_a_model_call_spends_an_attempt() -> None:
    called = {trouble for trouble, rule in retry.POLICY.items() if rule.budget is retry.Budget.MODEL_CALLS}
    assert called == {Trouble.MODEL_RATE_LIMITED, Trouble.MODEL_ERROR, Trouble.MODEL_UNREACHABLE}


# --- waits and budgets ---------------------------------------------------------------------------


def test_infrastructure_backoff_doubles_to_its_cap_and_never_gives_up() -> None:
    delays = [_decide(Trouble.INFRASTRUCTURE, attempt=n, rand=0.999) for n in range(12)]
    seconds = [d.seconds for d in delays if isinstance(d, Later)]
    assert len(seconds) == 12
    assert seconds[0] == pytest.approx(0.5, rel=0.01) and seconds[3] == pytest.approx(4.0, rel=0.01)
    assert max(seconds) <= retry.MAX_DELAY_SECONDS


def test_infrastructure_outage_is_waited_out_however_many_tries_it_took() -> None:
    decision = _decide(Trouble.INFRASTRUCTURE, attempt=5000, rand=0.999)
    assert isinstance(decision, Later) and decision.seconds == pytest.approx(retry.MAX_DELAY_SECONDS, rel=0.01)


def test_step_busy_waits_half_the_lease_and_at_least_a_second() -> None:
    assert _decide(Trouble.STEP_BUSY, attempt=99) == Later(15.0, counted_as=Reason.STEP_BUSY)
    short = _decide(Trouble.STEP_BUSY, settings=Settings(step_lease_seconds=1))
    assert isinstance(short, Later) and short.seconds == 1.0


def test_turn_not_recorded_is_tried_again_soon_then_every_half_second_for_twenty_seconds() -> None:
    waits: list[float] = []
    while isinstance(decision := _decide(Trouble.TURN_NOT_RECORDED, attempt=len(waits)), Later):
        waits.append(decision.seconds)
    assert waits[:7] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5]
    assert set(waits[6:]) == {0.5}
    assert 19.5 < sum(waits) <= 20.0
    assert isinstance(decision, Drop)


def test_model_wait_honours_the_hint_and_spends_the_time_budget() -> None:
    settings = Settings(llm_retry_budget_seconds=60)
    tries = ModelRetry(step_key=STEP, since=FIXED_NOW, calls=0)
    first = _decide(Trouble.MODEL_RATE_LIMITED, settings=settings, hint=10.0, model_retry=tries)
    assert isinstance(first, Later) and first.seconds == 10.0
    assert first.model_retry == ModelRetry(step_key=STEP, since=FIXED_NOW, calls=1)
    later = _decide(Trouble.MODEL_RATE_LIMITED, settings=settings, hint=10.0, model_retry=tries,
                    now=FIXED_NOW + timedelta(seconds=55))  # fmt: skip
    assert isinstance(later, GiveUp) and later.error.code is ErrorCode.LLM_RATE_LIMITED


def test_model_hint_is_spread_by_at_most_a_fifth() -> None:
    decision = _decide(Trouble.MODEL_ERROR, hint=10.0, rand=0.999)
    assert isinstance(decision, Later) and 11.9 < decision.seconds < 12.0


def test_model_wait_gives_up_when_the_calls_are_used_up_and_says_which_budget() -> None:
    tries = ModelRetry(step_key=STEP, since=FIXED_NOW, calls=2)
    decision = _decide(Trouble.MODEL_ERROR, settings=Settings(llm_max_attempts=3), model_retry=tries, message="down")
    assert isinstance(decision, GiveUp) and decision.error.code is ErrorCode.LLM_ERROR
    assert decision.error.message.startswith("down (gave up after 3 call(s) over 0s: ")
    assert "APTIX_LLM_RETRY_BUDGET_SECONDS=300, APTIX_LLM_MAX_ATTEMPTS=3" in decision.error.message


def test_model_wait_backs_off_exponentially_without_a_hint() -> None:
    waits = [
        _decide(Trouble.MODEL_UNREACHABLE, rand=0.999, model_retry=ModelRetry(step_key=STEP, since=FIXED_NOW, calls=n))
        for n in (0, 1, 2, 7)
    ]
    assert [w.seconds for w in waits if isinstance(w, Later)] == [
        pytest.approx(1.0, rel=0.01), pytest.approx(2.0, rel=0.01), pytest.approx(4.0, rel=0.01),
        pytest.approx(retry.MAX_DELAY_SECONDS, rel=0.01),
    ]  # fmt: skip


def test_breaker_and_pause_waits_spend_time_but_no_call() -> None:
    tries = ModelRetry(step_key=STEP, since=FIXED_NOW - timedelta(seconds=5), calls=2)
    for trouble in (Trouble.MODEL_BREAKER_OPEN, Trouble.MODEL_PAUSED):
        decision = _decide(trouble, hint=3.0, model_retry=tries)
        assert isinstance(decision, Later) and decision.model_retry == tries


def test_model_budget_starts_again_for_another_step() -> None:
    other = ModelRetry(step_key="0:2:llm_call:0", since=FIXED_NOW - timedelta(days=1), calls=19)
    decision = _decide(Trouble.MODEL_ERROR, model_retry=other)
    assert isinstance(decision, Later)
    assert decision.model_retry == ModelRetry(step_key=STEP, since=FIXED_NOW, calls=1)


def test_a_rate_limit_slot_is_exactly_its_hint_and_leaves_the_model_budget_alone() -> None:
    spent = ModelRetry(step_key=STEP, since=FIXED_NOW - timedelta(days=1), calls=20)
    decision = _decide(Trouble.MODEL_PACED, hint=400.0, rand=0.999, model_retry=spent)
    assert decision == Later(400.0)


def test_an_answer_no_retry_can_fix_gives_up_at_once_with_the_servers_words() -> None:
    decision = _decide(Trouble.MODEL_REJECTED, message="LLM server answered 400: bad")
    assert decision == GiveUp(ErrorInfo(code=ErrorCode.LLM_ERROR, message="LLM server answered 400: bad"))


def test_stalled_turn_is_re_driven_until_the_re_drives_are_spent() -> None:
    assert _decide(Trouble.STALLED, attempt=4) == Later(0.0)
    gave_up = _decide(Trouble.STALLED, attempt=5, message="the turn did not move")
    assert isinstance(gave_up, GiveUp) and gave_up.error.code is ErrorCode.INTERNAL_ERROR
    assert gave_up.error.message == "the turn did not move after 5 re-drives by the reconciler"


def test_waits_past_half_the_visibility_timeout_are_parked() -> None:
    assert retry.park_after(SETTINGS) == visibility_timeout(SETTINGS) / 2


# --- naming the trouble --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "trouble"),
    [
        (LlmError("slow down", status_code=429, retryable=True, retry_after=1.0), Trouble.MODEL_RATE_LIMITED),
        (LlmError("failed", code="rate_limit_exceeded", retryable=True), Trouble.MODEL_RATE_LIMITED),
        (LlmError("quota", status_code=429, code="insufficient_quota"), Trouble.MODEL_QUOTA_EXHAUSTED),
        (LlmError("down", status_code=503, retryable=True), Trouble.MODEL_ERROR),
        (LlmError("timeout", status_code=408, retryable=True), Trouble.MODEL_ERROR),
        (LlmError("failed", code="server_error", retryable=True), Trouble.MODEL_ERROR),
        (LlmError("no answer", retryable=True), Trouble.MODEL_UNREACHABLE),
        (LlmError("bad", status_code=400), Trouble.MODEL_REJECTED),
        (LlmError("incomplete", code="incomplete"), Trouble.MODEL_REJECTED),
        (LlmError("not JSON"), Trouble.MODEL_REJECTED),
    ],
)
def test_model_trouble_names_the_row_an_error_from_the_model_belongs_to(error: LlmError, trouble: Trouble) -> None:
    assert retry.model_trouble(error) is trouble


@pytest.mark.parametrize(
    ("error", "trouble"),
    [
        (StepBusy("k"), Trouble.STEP_BUSY),
        (TurnNotRecorded("t"), Trouble.TURN_NOT_RECORDED),
        (redis.ConnectionError("gone"), Trouble.INFRASTRUCTURE),
        (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), Trouble.INFRASTRUCTURE),
        (redis.exceptions.NoScriptError("No matching script. Please use EVAL."), Trouble.INFRASTRUCTURE),
        (redis.ResponseError("NOREPLICAS Not enough good replicas to write."), Trouble.INFRASTRUCTURE),
        (OperationalError("select 1", {}, Exception("gone")), Trouble.INFRASTRUCTURE),
        (StateConflict("raced"), Trouble.INFRASTRUCTURE),
        (ValueError("a bug"), None),
        (redis.ResponseError("a bug too"), None),
    ],
)
def test_trouble_of_names_the_row_of_an_exception_and_none_for_a_bug(error: Exception, trouble: Trouble | None) -> None:
    assert retry.trouble_of(error) is trouble
