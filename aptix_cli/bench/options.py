"""BenchOptions: what one ``aptix bench`` run measures, as the command line gave it."""

from __future__ import annotations

from dataclasses import dataclass

from shared.task_names import DEFAULT_TASK_BOUNDARIES, TaskBoundaries

__all__ = ["DEFAULT_DATABASE_URL", "DEFAULT_REDIS_URL", "SCENARIO_NAMES", "BenchOptions"]

SCENARIO_NAMES = ("plain", "server-tool", "client-tool")
"""Every scenario, in the order ``--scenario all`` runs them."""

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"
DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """The options of a production-shape run (``--embedded`` uses only turns and model latency)."""

    turns: int = 1000
    """Turns per scenario (and bare chains per scenario); with ``interactive``, the loading batch."""
    llm_latency_ms: float = 0.0
    """Latency the scripted model adds to every answer."""
    scenarios: tuple[str, ...] = SCENARIO_NAMES
    """The scenarios to run, from :data:`SCENARIO_NAMES`."""
    workers: int = 2
    """``aptix worker`` processes (each starts its own Celery worker per queue group)."""
    worker_args: tuple[str, ...] = ()
    """Extra flags for each ``aptix worker`` (e.g. ``--pool threads --concurrency 8``)."""
    redis_url: str = DEFAULT_REDIS_URL
    """The Redis server; the bench uses two empty databases of its own on it."""
    state_url: str | None = None
    """The state store on a Redis server of its own (an empty database claimed there) or a Redis Cluster
    (``redis+cluster://``, used whole); None: on ``redis_url``'s server, beside the broker."""
    database_url: str = DEFAULT_DATABASE_URL
    """A PostgreSQL database the bench may create (and drop) a scratch database from."""
    interactive: bool = False
    """Measure interactive turns' p95 latency idle and under a batch, instead of the scenarios."""
    rss: bool = False
    """Print the workers' summed RSS after the warm-up and after each run."""
    two_orgs: bool = False
    """Two organisations' batches of ``turns`` side by side, instead of the scenarios (fair admission)."""
    openai_batch: bool = False
    """A file of ``turns`` requests through ``/openai/v1/files`` and ``/openai/v1/batches``, end to end, instead of
    the scenarios; with ``two_orgs``, two organisations' OpenAI batches side by side."""
    task_events: bool = False
    """Turn the workers' Celery task events on, as Flower does when it watches (they start off)."""
    task_boundaries: TaskBoundaries = DEFAULT_TASK_BOUNDARIES
    """Where the workers end a step task (``APTIX_TASK_BOUNDARIES``): at every layer, where the queue changes, or
    before a call."""
    peers: bool = False
    """Also run the server-tool turn in the durable peers (DBOS Transact, LangGraph), in the same run."""
    peers_dir: str | None = None
    """The cache folder of the peers' virtualenvs; None: ``.venv-peers`` in the checkout."""
