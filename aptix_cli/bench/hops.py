"""A turn's hops: the Celery tasks its pipeline ran, in order, and the queue of each.

The CompositionTrace is not one record per task (the first reasoner task records nothing, the
entry task records several steps), so the hops are read from the turn's state instead: its
``steps_done`` holds every step that ran, keyed ``round:hop:step:iteration``. In a round the
driver runs consecutive steps inside one task when ``shared.task_names.same_task`` says so (the
same layer, with ``APTIX_TASK_BOUNDARIES=queue`` the same queue, with ``call`` up to the next call, the
entry's task making the round's first), so the round's tasks are its
steps in order with each such run collapsed into the task of its first step, and each round (the
first run, then one per client tool re-entry) starts a new chain.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis

from shared.state.keys import state_key
from shared.task_names import (
    LAYER_OF,
    Layer,
    Queue,
    StepName,
    TaskBoundaries,
    entry_call_after,
    same_task,
    step_queue,
    task_name,
)

__all__ = ["TurnHops", "hop_tasks", "read_hops"]

_FIRST_STEP = {task_name(step): step for step in reversed(StepName)}
"""A step of each task, for its queue (the entry's first: every entry step goes on the same queue)."""


@dataclass(frozen=True, slots=True)
class TurnHops:
    """The tasks one turn ran, in order."""

    tasks: tuple[str, ...]
    boundaries: TaskBoundaries = TaskBoundaries.LAYER
    """Where the workers that ran the turn ended a task: it decides the entry's queue."""

    @property
    def queues(self) -> tuple[str, ...]:
        """The queue of each task (``shared.task_names.step_queue``)."""
        return tuple(step_queue(_FIRST_STEP[name], self.boundaries).value for name in self.tasks)

    def describe(self) -> str:
        """E.g. ``entry > reasoner > compose > llm_call > reasoner > persist``."""
        return " > ".join(name.removeprefix("aptix.step.") for name in self.tasks)


def hop_tasks(step_keys: Iterable[str], boundaries: TaskBoundaries = TaskBoundaries.LAYER) -> tuple[str, ...]:
    """The task names a turn ran, from the keys of its ``steps_done``.

    Args:
        step_keys: ``round:hop:step:iteration`` keys, in any order.
        boundaries: where the workers that ran the turn end a task (``APTIX_TASK_BOUNDARIES``).

    Returns:
        One task name per hop, in order.

    Raises:
        ValueError: a key is not a step key.
    """
    steps: list[tuple[int, int, StepName]] = []
    for key in step_keys:
        parts = key.split(":")
        if len(parts) != 4:
            raise ValueError(f"not a step key: {key!r}")
        steps.append((int(parts[0]), int(parts[1]), StepName(parts[2])))
    tasks: list[str] = []
    previous: tuple[int, StepName] | None = None
    entry_call = False  # the task began at a round's entry and made no call yet (``same_task``)
    for round_, _hop, step in sorted(steps):
        if (
            previous is None
            or previous[0] != round_
            or not same_task(previous[1], step, boundaries, entry_call=entry_call)
        ):
            tasks.append(task_name(step))
            entry_call = LAYER_OF[step] is Layer.ENTRY and step_queue(step, boundaries) is Queue.LLM
        else:
            entry_call = entry_call_after(step, entry_call)
        previous = (round_, step)
    return tuple(tasks)


def read_hops(
    client: redis.Redis, turn_ids: Iterable[str], boundaries: TaskBoundaries = TaskBoundaries.LAYER
) -> dict[str, TurnHops]:
    """The hops of each turn whose state is still in the state store (``client``: its Redis database), run by
    workers that end their tasks at ``boundaries``."""
    ids = list(turn_ids)
    # One GET each in a pipeline: a cluster spreads the turns' keys over slots, where MGET cannot reach.
    pipe = client.pipeline(transaction=False)
    for turn_id in ids:
        pipe.get(state_key(turn_id))
    documents = pipe.execute() if ids else []
    found: dict[str, TurnHops] = {}
    for turn_id, document in zip(ids, documents, strict=True):
        if document is None:
            continue
        state = json.loads(document)
        steps_done = state.get("steps_done") if isinstance(state, Mapping) else None
        if isinstance(steps_done, Mapping):
            found[turn_id] = TurnHops(hop_tasks(steps_done, boundaries), boundaries)
    return found
