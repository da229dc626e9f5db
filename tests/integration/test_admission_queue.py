"""AdmissionQueue's Lua on a real Redis, and the scheduler's release, re-send and sweep on it.

Round-robin order across organisations, the per-organisation cap, in-flight removal (also by the
worker's last state save), a releasing note re-sent after a scheduler "died" between the move and
the send, two schedulers at once, withdraw, and turns that end early leaving. Times are injected: nothing here waits.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import redis

from shared.models.envelope import BATCH_START_PRIORITY, TurnEnvelope
from shared.models.turn import TurnStatus
from shared.settings import Settings
from shared.state import MemoryStateStore, RedisStateStore, TurnState
from shared.state.admission import DELAY_FRESH_SECONDS, REPUBLISH_AFTER_SECONDS, AdmissionQueue, DelayReport
from shared.state.keys import ADMISSION_DELAYS_KEY, SCHEDULER_LEADER_KEY
from shared.state.leader import LeaderLease
from shared.step_sender import StepSender
from shared.task_names import StepName
from tests.support.redis_round_trips import CountingRedis
from workers.admission_window import AdmissionWindow
from workers.scheduler import AdmissionScheduler

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0


class _Statuses:
    """The one TurnRepository method the scheduler's sweep reads, answering from a dict."""

    def __init__(self) -> None:
        self.known: dict[str, TurnStatus] = {}

    def statuses(self, turn_ids: list[str]) -> dict[str, TurnStatus]:
        return {turn_id: self.known[turn_id] for turn_id in turn_ids if turn_id in self.known}


class _Kept:
    """The scheduler's broker: keeps the envelopes it is given in ``sent``."""

    def __init__(self, sent: list[TurnEnvelope]) -> None:
        self.sent = sent

    def publish(self, envelopes: Sequence[TurnEnvelope], *, countdown: float) -> None:
        self.sent.extend(envelopes)


def _scheduler(
    client: redis.Redis, sent: list[TurnEnvelope], *, cap: int, owner: str = "s1", turns: _Statuses | None = None
) -> AdmissionScheduler:
    return AdmissionScheduler(
        settings=Settings(org_max_in_flight=cap),
        admission=AdmissionQueue(client),
        turns=turns or _Statuses(),  # type: ignore[arg-type]  # only statuses() is read
        steps=StepSender(_Kept(sent), timers=MemoryStateStore(), park_after=30),
        leader=LeaderLease(client, key=SCHEDULER_LEADER_KEY, owner=owner),
        clock=lambda: T0,
    )


def test_release_is_round_robin_across_organisations_in_acceptance_order(redis_client: redis.Redis) -> None:
    queue = AdmissionQueue(redis_client)
    queue.hold("org-b", ["b1", "b2", "b3"])
    queue.hold("org-a", ["a1", "a2", "a3", "a4", "a5"])
    queue.hold("org-c", ["c1"])
    queue.hold("org-a", ["a6"])
    released = queue.release(cap=100, limit=100, now=T0)
    assert released is not None
    # One turn per organisation per round, organisations in a fixed order, each queue in order;
    # an organisation whose queue is empty is skipped
    assert released.turn_ids == ["a1", "b1", "c1", "a2", "b2", "a3", "b3", "a4", "a5", "a6"]


def test_a_release_cut_short_resumes_after_the_last_organisation_served(redis_client: redis.Redis) -> None:
    queue = AdmissionQueue(redis_client)
    queue.hold("org-a", [f"a{i}" for i in range(5)])
    queue.hold("org-b", [f"b{i}" for i in range(5)])
    first, second = queue.release(cap=100, limit=3, now=T0), queue.release(cap=100, limit=3, now=T0)
    assert first is not None and second is not None
    assert first.turn_ids == ["a0", "b0", "a1"]
    assert second.turn_ids == ["b1", "a2", "b2"]


def test_no_organisation_gets_more_than_the_cap_in_flight(redis_client: redis.Redis) -> None:
    queue = AdmissionQueue(redis_client)
    queue.admit_now("org-a", ["interactive"], now=T0)  # an interactive turn counts too
    queue.hold("org-a", [f"a{i}" for i in range(10)])
    queue.hold("org-b", [f"b{i}" for i in range(10)])
    released = queue.release(cap=3, limit=100, now=T0)
    assert released is not None
    assert released.turn_ids == ["a0", "b0", "a1", "b1", "b2"]
    assert queue.release(cap=3, limit=100, now=T0) is None
    counts = queue.counts()
    assert (counts["org-a"].held, counts["org-a"].in_flight) == (8, 3)
    assert (counts["org-b"].held, counts["org-b"].in_flight) == (7, 3)


def test_an_organisation_with_a_cap_of_its_own_gets_that_many_in_flight(redis_client: redis.Redis) -> None:
    # Given org-a's own cap of 1 and org-c's own cap of 5 (aptix orgs set --max-in-flight), org-b on the default 3
    queue = AdmissionQueue(redis_client)
    for org in ("org-a", "org-b", "org-c"):
        queue.hold(org, [f"{org}-{i}" for i in range(10)])
    # When the scheduler releases all it may
    sent: list[TurnEnvelope] = []
    scheduler = _scheduler(redis_client, sent, cap=3)
    scheduler._caps = lambda: {"org-a": 1, "org-c": 5}
    assert scheduler.lead()
    scheduler.release(T0)
    # Then each organisation has its own cap in flight
    counts = queue.counts()
    assert {org: counts[org].in_flight for org in counts} == {"org-a": 1, "org-b": 3, "org-c": 5}


def test_a_turn_that_ends_frees_its_slot_and_wakes_the_scheduler(redis_client: redis.Redis) -> None:
    queue = AdmissionQueue(redis_client)
    queue.hold("org-a", ["a0", "a1"])
    assert queue.wait(0.01)  # holding nudged
    released = queue.release(cap=1, limit=10, now=T0)
    assert released is not None and released.turn_ids == ["a0"]
    assert not queue.wait(0.01)
    assert queue.finished("org-a", ["a0", "unknown"]) == 1
    assert queue.wait(0.01)
    after = queue.release(cap=1, limit=10, now=T0)
    assert after is not None and after.turn_ids == ["a1"]
    assert queue.finished("org-a", ["a0"]) == 0
    assert not queue.wait(0.01)  # nothing was in flight: no nudge


def test_the_last_state_save_of_a_turn_takes_it_out_of_flight_when_told_to(redis_client: redis.Redis) -> None:
    store, queue = RedisStateStore(redis_client), AdmissionQueue(redis_client)
    queue.hold("org-a", ["turn_x"])
    queue.release(cap=5, limit=5, now=T0)
    state = TurnState(turn_id="turn_x", session_id="s", org_id="org-a", user_id="u", user_input="hi", new_session=True)
    store.save(state, ttl_seconds=60, alive_until=T0 + 60)  # a step that passes the turn on
    store.save(state, ttl_seconds=60, alive_until=None)  # a save that is not told to leave admission does not
    assert queue.counts()["org-a"].in_flight == 1
    store.save(state, ttl_seconds=60, leave_admission=True)  # the chain ends (committed or paused)
    assert queue.counts()["org-a"].in_flight == 0
    assert queue.wait(0.01)


def test_a_release_whose_scheduler_died_before_sending_is_sent_again_once(redis_client: redis.Redis) -> None:
    queue = AdmissionQueue(redis_client)
    queue.hold("org-a", ["a0", "a1"])
    # Given a scheduler that moved the turns to in flight and died before sending them
    moved = queue.release(cap=10, limit=10, now=T0)
    assert moved is not None
    # When another scheduler runs before the note is old: nothing is sent (the first may still send)
    sent: list[TurnEnvelope] = []
    later = _scheduler(redis_client, sent, cap=10)
    assert later.republish_stale(T0 + 1) == 0 and sent == []
    # Then once it is old, the turns' first messages are sent, once, and the note is gone
    assert later.republish_stale(T0 + REPUBLISH_AFTER_SECONDS + 1) == 2
    assert later.republish_stale(T0 + REPUBLISH_AFTER_SECONDS + 2) == 0
    assert [(e.turn_id, e.step, e.priority) for e in sent] == [
        ("a0", StepName.REQUEST_HANDLER, BATCH_START_PRIORITY),
        ("a1", StepName.REQUEST_HANDLER, BATCH_START_PRIORITY),
    ]
    assert queue.release(cap=10, limit=10, now=T0) is None  # not released a second time


def test_a_release_that_was_sent_leaves_no_note_after_the_next_release(redis_client: redis.Redis) -> None:
    sent: list[TurnEnvelope] = []
    scheduler = _scheduler(redis_client, sent, cap=10)
    queue = AdmissionQueue(redis_client)
    queue.hold("org-a", ["a0", "a1", "a2"])
    # Given a release whose first messages were sent
    assert scheduler.release(T0) == 3
    assert [e.turn_id for e in sent] == ["a0", "a1", "a2"]
    # Then its note waits for the scheduler's next round trip, and the scheduler never sends them again itself
    assert len(queue.stale_releases(now=T0 + 3600)) == 1
    assert scheduler.republish_stale(T0 + 3600) == 0
    # When the next release runs (nothing left to release), its first round trip deletes the note
    assert scheduler.release(T0 + 1) == 0
    assert queue.stale_releases(now=T0 + 3600) == []
    assert _scheduler(redis_client, sent, cap=10, owner="s2").republish_stale(T0 + 3600) == 0
    assert len(sent) == 3


def test_a_scheduler_that_stops_deletes_the_notes_of_what_it_sent(redis_client: redis.Redis) -> None:
    sent: list[TurnEnvelope] = []
    scheduler = _scheduler(redis_client, sent, cap=10)
    queue = AdmissionQueue(redis_client)
    queue.hold("org-a", ["a0"])
    stop = threading.Event()
    stop.set()
    assert scheduler.release(T0) == 1
    scheduler.run(stop)  # told to stop before its first look
    assert queue.stale_releases(now=T0 + 3600) == []


def test_a_release_reads_the_organisations_and_their_counts_in_one_round_trip_once_it_knows_them(
    redis_client: redis.Redis,
) -> None:
    client = CountingRedis(connection_pool=redis_client.connection_pool)
    queue = AdmissionQueue(client)
    queue.hold("org-a", ["a0", "a1"])
    queue.hold("org-b", ["b0"])
    first = queue.release(cap=10, limit=1, now=T0)
    assert first is not None and first.turn_ids == ["a0"]
    # Given a queue that has seen both organisations, and a release sent since
    before = client.round_trips
    second = queue.release(cap=10, limit=10, now=T0, settled=[first])
    # Then the release is two round trips (the reads with the note's deletion, then the moves) and releases the rest
    assert client.round_trips - before == 2
    assert second is not None and sorted(second.turn_ids) == ["a1", "b0"]
    assert sorted(r.release_id for r in queue.stale_releases(now=T0 + 3600)) == [second.release_id] * 2
    # And an organisation new to the queue costs a round trip for its counts, and is released like the others
    queue.hold("org-c", ["c0", "c1"])
    before = client.round_trips
    third = queue.release(cap=10, limit=10, now=T0, settled=[second])
    assert client.round_trips - before == 3
    assert third is not None and third.turn_ids == ["c0", "c1"]
    assert [r.release_id for r in queue.stale_releases(now=T0 + 3600)] == [third.release_id]


def test_two_schedulers_at_once_release_each_turn_once(redis_client: redis.Redis) -> None:
    queue = AdmissionQueue(redis_client)
    turn_ids = [f"{org}-{i}" for org in ("org-a", "org-b", "org-c") for i in range(400)]
    for org in ("org-a", "org-b", "org-c"):
        queue.hold(org, [turn_id for turn_id in turn_ids if turn_id.startswith(org)])
    sent: list[list[TurnEnvelope]] = [[], []]
    schedulers = [_scheduler(redis_client, sent[i], cap=1000, owner=f"s{i}") for i in range(2)]
    threads = [threading.Thread(target=lambda s=s: [s.release(T0) for _ in range(20)]) for s in schedulers]  # type: ignore[misc]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    released = [e.turn_id for envelopes in sent for e in envelopes]
    assert sorted(released) == sorted(turn_ids)  # every turn, none twice
    assert all(sent), "both copies released some turns"


def test_withdraw_takes_held_turns_out_but_leaves_released_ones(redis_client: redis.Redis) -> None:
    queue = AdmissionQueue(redis_client)
    queue.hold("org-a", ["a0", "a1", "a2", "a3"])
    queue.release(cap=10, limit=1, now=T0)  # a0 released
    assert queue.withdraw("org-a", ["a0", "a2", "a3", "other"]) == 2
    assert queue.where("org-a", ["a0", "a1", "a2"]) == {"a0": "in_flight", "a1": "held", "a2": None}
    released = queue.release(cap=10, limit=10, now=T0)
    assert released is not None and released.turn_ids == ["a1"]


def test_turns_that_end_early_leave_held_and_in_flight_in_one_call_and_wake_the_scheduler(
    redis_client: redis.Redis,
) -> None:
    queue = AdmissionQueue(redis_client)
    queue.hold("org-a", ["a0", "a1", "a2"])
    queue.release(cap=10, limit=1, now=T0)  # a0 released
    assert queue.wait(0.01)
    assert queue.leave("org-a", ["a0", "a1", "other"]) == 1  # a0 was in flight, a1 held
    assert queue.where("org-a", ["a0", "a1", "a2"]) == {"a0": None, "a1": None, "a2": "held"}
    assert queue.wait(0.01)  # a slot was freed
    assert queue.leave("org-a", ["a2"]) == 0
    assert not queue.wait(0.01)  # only a held turn left: no slot was freed
    assert queue.release(cap=10, limit=10, now=T0) is None


def test_the_sweep_drops_turns_that_ended_unannounced(redis_client: redis.Redis) -> None:
    turns = _Statuses()
    sent: list[TurnEnvelope] = []
    scheduler = _scheduler(redis_client, sent, cap=10, turns=turns)
    queue = AdmissionQueue(redis_client)
    queue.admit_now("org-a", ["done", "cancelled", "running", "unrecorded"], now=T0)
    turns.known.update(done=TurnStatus.COMPLETED, cancelled=TurnStatus.CANCELLED, running=TurnStatus.RUNNING)
    assert scheduler.sweep(T0 + 1) == 0  # too recent to check
    assert scheduler.sweep(T0 + 10) == 2
    assert queue.where("org-a", ["running", "unrecorded"]) == {"running": "in_flight", "unrecorded": "in_flight"}
    assert scheduler.sweep(T0 + 600) == 1  # a turn the database never recorded, after a while
    assert queue.counts()["org-a"].in_flight == 1


def test_a_release_never_passes_the_window_whatever_room_the_caps_leave(redis_client: redis.Redis) -> None:
    queue = AdmissionQueue(redis_client)
    queue.admit_now("org-a", ["interactive"], now=T0)  # an interactive turn counts in the window too
    queue.hold("org-a", [f"a{i}" for i in range(10)])
    queue.hold("org-b", [f"b{i}" for i in range(10)])
    released = queue.release(cap=100, limit=100, now=T0, window=4)
    assert released is not None and released.turn_ids == ["a0", "b0", "a1"]
    assert queue.release(cap=100, limit=100, now=T0, window=4) is None
    assert queue.finished("org-b", ["b0"]) == 1
    after = queue.release(cap=100, limit=100, now=T0, window=4)
    assert after is not None and after.turn_ids == ["b1"]


def test_the_workers_delay_reports_are_read_while_fresh_and_forgotten_after_a_minute(redis_client: redis.Redis) -> None:
    queue = AdmissionQueue(redis_client)
    fresh = DelayReport(least=0.004, samples=12, at=T0 - 1)
    queue.report_delay("llm.1@a:10", fresh)
    queue.report_delay("llm.1@a:10", DelayReport(least=0.5, samples=1, at=T0 - 1.5))  # replaced by its next
    queue.report_delay("llm.1@a:10", fresh)
    queue.report_delay("pipeline.1@a:11", DelayReport(least=0.003, samples=3, at=T0 - DELAY_FRESH_SECONDS - 1))
    queue.report_delay("llm.2@b:12", DelayReport(least=0.003, samples=3, at=T0 - 120))  # a process that stopped
    redis_client.hset(ADMISSION_DELAYS_KEY, "garbled", "{not json")
    assert queue.delays(now=T0) == [fresh]
    assert sorted(redis_client.hkeys(ADMISSION_DELAYS_KEY)) == [b"llm.1@a:10", b"pipeline.1@a:11"]


def test_the_scheduler_holds_turns_back_while_the_workers_messages_queue_and_lets_more_go_when_they_do_not(
    redis_client: redis.Redis,
) -> None:
    # Given a scheduler with a window of 8 aiming at 5 ms, and 40 turns held
    clock = [T0]
    sent: list[TurnEnvelope] = []
    queue = AdmissionQueue(redis_client)
    scheduler = AdmissionScheduler(
        settings=Settings(org_max_in_flight=128),
        admission=queue,
        turns=_Statuses(),  # type: ignore[arg-type]  # only statuses() is read
        steps=StepSender(_Kept(sent), timers=MemoryStateStore(), park_after=30),
        leader=LeaderLease(redis_client, key=SCHEDULER_LEADER_KEY, owner="s1"),
        clock=lambda: clock[0],
        window=AdmissionWindow(target_seconds=0.005, initial=8),
    )
    assert scheduler.lead()
    queue.hold("org-a", [f"a{i}" for i in range(40)])
    # When a worker reports that even its shortest wait was 20 ms
    queue.report_delay("llm.1@a:1", DelayReport(least=0.020, samples=50, at=T0))
    scheduler.step()
    # Then the window shrinks to 6 and only 6 turns go
    assert len(sent) == 6 and queue.counts()["org-a"].in_flight == 6
    # And when, half a second on, the shortest wait is 1 ms, the full window grows by a quarter
    clock[0] = T0 + 0.5
    queue.report_delay("llm.1@a:1", DelayReport(least=0.001, samples=50, at=clock[0]))
    scheduler.step()
    assert len(sent) == 7 and queue.counts()["org-a"].in_flight == 7
    # And it is not resized again before the half second is over
    queue.report_delay("llm.1@a:1", DelayReport(least=0.001, samples=50, at=clock[0] + 0.1))
    clock[0] += 0.1
    scheduler.step()
    assert len(sent) == 7
