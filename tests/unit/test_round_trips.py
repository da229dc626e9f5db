"""What a plain turn costs hop by hop (a message per layer, and by default a message per call): the
state store's Redis round trips (a step's begin and its save) and the database's statements and
transactions, with and without webhooks; and what the gateway's writes cost the database (recording
a turn, resuming it, recording a batch). The counts are the hot path's budget: a change that adds a
round trip to a hop shows here.

The state store is the Redis one, on fakeredis (its Lua scripts run); the database is SQLite in
memory; the model's breaker is on a Redis of its own, not counted (``docs/benchmarks.md`` counts it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import fakeredis
from redis.client import Pipeline
from sqlalchemy import event

from shared.db.webhook_outbox import WebhookOutbox
from shared.models.batch import BatchRequest, BatchTurnRequest
from shared.models.turn import ToolResult, ToolResultsRequest, TurnRequest
from shared.state import RedisStateStore
from shared.webhooks import WebhookConfig, WebhookSender
from tests.unit.fakes import ORG as CALLER
from tests.unit.fakes import USER, FakeLlm, Gateway, make_context, record_turn, sqlite_engine
from workers.context import StepContext, lease_renewer
from workers.driver import run_step
from workers.llm.types import LlmResponse

ORG = "o"
"""The organisation of every turn ``record_turn`` records."""
PLAIN_TURN = ["request_handler", "reasoner", "compose", "llm_call", "reasoner", "persist"]


class _CountingRedis(fakeredis.FakeRedis):
    """Counts its round trips: each command it sends, and each pipeline as one (its first command's name)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands: list[str] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands.append(str(args[0]))
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        return _CountingPipeline(self, transaction)


class _CountingPipeline(Pipeline):
    def __init__(self, client: _CountingRedis, transaction: bool) -> None:
        super().__init__(client.connection_pool, client.response_callbacks, transaction, None)
        self._counted = client.commands

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        if self.command_stack:
            self._counted.append(f"pipeline:{self.command_stack[0][0][0]}")
        return super().execute(raise_on_error)


@dataclass(frozen=True)
class _Hop:
    step: str
    redis: int
    statements: int
    transactions: int
    webhooks: int


def _plain_turn(*, webhooks: bool, task_boundaries: str = "layer") -> list[_Hop]:
    """Run two plain turns (the first loads the Lua scripts, as a worker's first turn does) and count the second,
    a message at a time (a task per layer unless ``task_boundaries`` says otherwise)."""
    client, engine = _CountingRedis(), sqlite_engine()
    sent: list[str] = []
    config = WebhookConfig(secrets={ORG: b"0123456789abcdef0123"}, default_urls={ORG: "https://h.example/in"})
    ctx = make_context(
        FakeLlm(
            *(
                LlmResponse(response_id="r", output_text=text, input_tokens=30, output_tokens=2)
                for text in ("warm-up", "hello")
            )
        ),  # used tokens: the commit's are merged into the day's count
        engine=engine,
        outbox=WebhookOutbox(config) if webhooks else None,
        webhook_sender=WebhookSender(sent.append) if webhooks else None,
        task_boundaries=task_boundaries,
    )
    store = RedisStateStore(client)
    ctx = replace(
        ctx, states=store, cancel_flags=store, in_flight=store, timers=store, leases=lease_renewer(store, ctx.settings)
    )
    statements: list[str] = []
    ends: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    event.listen(engine, "commit", lambda *args: ends.append("commit"))
    event.listen(engine, "rollback", lambda *args: ends.append("rollback"))
    _drive(ctx, "turn_" + "8" * 32, "sess_" + "8" * 32)

    hops: list[_Hop] = []
    message = record_turn(ctx, turn_id="turn_" + "9" * 32, session_id="sess_" + "9" * 32)
    while True:
        for seen in (client.commands, statements, ends, sent):
            seen.clear()
        dispatch = run_step(ctx, message)
        hops.append(_Hop(message.step.value, len(client.commands), len(statements), ends.count("commit"), len(sent)))
        if dispatch is None:
            return hops
        message = dispatch.envelope


def _drive(ctx: StepContext, turn_id: str, session_id: str) -> None:
    dispatch = run_step(ctx, record_turn(ctx, turn_id=turn_id, session_id=session_id))
    while dispatch is not None:
        dispatch = run_step(ctx, dispatch.envelope)


def test_every_hop_of_a_plain_turn_costs_two_state_store_round_trips() -> None:
    hops = _plain_turn(webhooks=False)
    assert [hop.step for hop in hops] == PLAIN_TURN
    assert [hop.redis for hop in hops] == [2] * 6  # begin, save


def test_by_default_a_plain_turn_is_one_message_of_two_round_trips() -> None:
    hops = _plain_turn(webhooks=False, task_boundaries="call")
    assert [hop.step for hop in hops] == ["request_handler"]
    # the entry's message runs on into the model call, then the reasoner and the commit: begin, and the last save,
    # which holds the model's answer too (it is saved apart only when a step after it meets trouble), and merges the
    # commit's tokens into the organisation's count of the day
    assert [hop.redis for hop in hops] == [2]
    # the start (its session's row in the same transaction) and the commit: the model's answer is in the commit's
    # snapshot, the same task's, so it has no checkpoint of its own (a message per layer writes one, below)
    assert [(hop.statements, hop.transactions) for hop in hops] == [(7, 2)]


def test_a_plain_turn_writes_the_database_at_its_start_its_model_answer_and_its_commit() -> None:
    hops = _plain_turn(webhooks=False)
    # request_handler: start the turn and read it back (one statement), create its session, in one transaction
    # (before: two; before that a read, then the start, three statements); llm_call: the checkpoint of the model's
    # answer; persist: the commit point
    assert [(hop.statements, hop.transactions) for hop in hops] == [(2, 1), (0, 0), (0, 0), (2, 1), (0, 0), (5, 1)]


def test_with_webhooks_the_commit_records_its_event_in_its_transaction_and_the_driver_sends_it() -> None:
    hops = _plain_turn(webhooks=True)
    assert [hop.redis for hop in hops] == [2] * 6
    # the outbox row in the commit's transaction (a savepoint, the row read back, the insert), no transaction more
    assert [(hop.statements, hop.transactions) for hop in hops][-1] == (9, 1)
    assert Counter(hop.webhooks for hop in hops) == {0: 5, 1: 1} and hops[-1].webhooks == 1


def test_the_gateway_writes_a_turn_a_resume_and_a_batch_in_one_transaction_each(gateway: Gateway) -> None:
    statements: list[str] = []
    ends: list[str] = []
    event.listen(gateway.engine, "before_cursor_execute", lambda *args: statements.append(args[2].split()[0]))
    event.listen(gateway.engine, "commit", lambda *args: ends.append("commit"))

    def cost(write: Any) -> tuple[list[str], int]:
        statements.clear()
        ends.clear()
        write()
        return list(statements), len(ends)

    keyed = TurnRequest(input="hi", idempotency_key="k")
    # the organisations' limits and the webhook secrets are read once per REFRESH_SECONDS, not per request
    assert cost(lambda: gateway.service.record(TurnRequest(input="warm"), org_id=CALLER, user_id=USER))[0].count(
        "SELECT"
    ) in (1, 2)
    # a new session's turn: its row; with a key, the key's read first; a replay: the read alone
    assert cost(lambda: gateway.service.record(TurnRequest(input="hi"), org_id=CALLER, user_id=USER)) == (["INSERT"], 1)
    assert cost(lambda: gateway.service.record(keyed, org_id=CALLER, user_id=USER)) == (["SELECT", "INSERT"], 1)
    assert cost(lambda: gateway.service.record(keyed, org_id=CALLER, user_id=USER)) == (["SELECT"], 0)
    # a resume: the turn read and its overdue check, the row locked and updated, the turn read back
    turn_id = gateway.paused_turn(gateway.session())
    results = ToolResultsRequest(tool_results=[ToolResult(call_id="call_1", output="x")])
    assert cost(lambda: gateway.service.resume(turn_id, results, org_id=CALLER)) == (
        ["SELECT", "SELECT", "SELECT", "UPDATE", "SELECT"], 1
    )  # fmt: skip
    # a batch: its row and its turns' (one statement per 500), then its counts
    batch = BatchRequest(requests=[BatchTurnRequest(input=text) for text in "abc"])
    recorded = cost(lambda: gateway.batches.record(batch, org_id=CALLER, user_id=USER))
    assert recorded == (["INSERT", "INSERT", "SELECT"], 1)
