"""aptix_cli.worker_group.plan: which Celery worker processes `aptix worker` runs for its flags."""

from __future__ import annotations

import pytest

from aptix_cli.worker_group import WorkerSpec, node_name, plan


def test_no_flags_give_a_pipeline_process_and_an_llm_process_each_on_its_pool() -> None:
    assert plan("pipeline,llm,tools") == [
        WorkerSpec(group="pipeline", queues="pipeline,tools", pool="threads", concurrency=2),
        WorkerSpec(group="llm", queues="llm", pool="gevent", concurrency=2000),
    ]


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


def test_every_process_of_aptix_worker_gets_its_own_node_name_with_or_without_hostname() -> None:
    specs = plan("pipeline,llm,tools", processes=2)
    for hostname in (None, "w@%h"):
        names = [node_name(spec, hostname, pid=41, grouped=True) for spec in specs]
        assert len(set(names)) == len(specs) == 3, names
    assert [node_name(spec, None, pid=41, grouped=True) for spec in specs] == [
        "pipeline1.41@%h", "pipeline2.41@%h", "llm.41@%h"
    ]  # fmt: skip


def test_lone_worker_is_never_named_celery_at_host_when_given_no_hostname() -> None:
    [spec] = plan("llm")
    # Two `aptix worker --queues llm` on one host: distinct names (their pids differ), not celery@<host>
    assert node_name(spec, None, pid=41, grouped=False) == "llm.41@%h"
    assert node_name(spec, None, pid=41, grouped=False) != node_name(spec, None, pid=42, grouped=False)
    assert node_name(spec, "llm@%h", pid=41, grouped=False) == "llm@%h"
