"""aptix_cli.worker_group.plan: which Celery worker processes `aptix worker` runs for its flags."""

from __future__ import annotations

import pytest

from aptix_cli.worker_group import WorkerSpec, plan


def test_no_flags_give_a_pipeline_process_and_an_llm_process_each_on_its_pool() -> None:
    assert plan("pipeline,llm,tools") == [
        WorkerSpec(group="pipeline", queues="pipeline,tools", pool="threads", concurrency=2),
        WorkerSpec(group="llm", queues="llm", pool="gevent", concurrency=2000),
    ]


def test_webhook_deliveries_share_the_gevent_process_of_the_llm_queue() -> None:
    # `aptix worker`'s default queues: webhooks wait on the network, like model calls
    assert plan("pipeline,llm,tools,webhooks") == [
        WorkerSpec(group="pipeline", queues="pipeline,tools", pool="threads", concurrency=2),
        WorkerSpec(group="llm", queues="llm,webhooks", pool="gevent", concurrency=2000),
    ]
    assert plan("webhooks") == [WorkerSpec(group="llm", queues="webhooks", pool="gevent", concurrency=2000)]


def test_processes_sets_how_many_pipeline_processes_and_concurrency_their_threads() -> None:
    assert plan("pipeline", concurrency=6, processes=2) == [
        WorkerSpec("pipeline1", "pipeline", "threads", 6),
        WorkerSpec("pipeline2", "pipeline", "threads", 6),
    ]
    assert plan("tools,llm", processes=1) == [
        WorkerSpec("pipeline", "tools", "threads", 2),
        WorkerSpec("llm", "llm", "gevent", 2000),
    ]


def test_one_group_takes_its_pool_and_an_explicit_concurrency() -> None:
    assert plan("llm", concurrency=3000) == [WorkerSpec(group="llm", queues="llm", pool="gevent", concurrency=3000)]


def test_an_explicit_pool_serves_every_queue_in_one_process() -> None:
    assert plan("pipeline,llm", pool="threads", concurrency=4) == [
        WorkerSpec(group="pipeline", queues="pipeline,llm", pool="threads", concurrency=4)
    ]


@pytest.mark.parametrize(
    ("queues", "concurrency", "message"),
    [
        ("pipeline,bogus", None, "unknown queue(s) bogus"),
        (" , ", None, "(none)"),
        ("pipeline,llm", 10, "--concurrency"),
    ],
)
def test_bad_flags_are_refused_with_a_reason(queues: str, concurrency: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(queues, concurrency=concurrency)
    with pytest.raises(ValueError, match="--processes"):
        plan("pipeline", processes=0)
