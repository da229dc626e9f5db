"""Settings: every ``APTIX_*`` variable of the public contract, typed and validated once.

Only entrypoints (the CLI, ``create_app``, ``create_celery``, worker start-up) call
:func:`get_settings`; everything below receives a :class:`Settings` or the values it needs.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, NonNegativeInt, PositiveInt, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.redis_clients import check_redis_url, parse_sentinel_url
from shared.task_names import DEFAULT_TASK_BOUNDARIES, TaskBoundaries
from shared.webhooks.parsing import parse_default_urls, parse_retry_schedule, parse_secrets

__all__ = [
    "OTHER_VARIABLES",
    "ApiKey",
    "Settings",
    "get_settings",
    "known_variables",
    "parse_api_keys",
    "placeholder_api_keys",
    "unknown_variables",
]

_EMBEDDED_DATABASE_URL = "sqlite:///./aptix-dev.sqlite"


class ApiKey:
    """One accepted API key: the identity it stands for, and the id that names it (never the key itself)."""

    __slots__ = ("key_id", "org_id", "user_id")

    def __init__(self, key_id: str, org_id: str, user_id: str) -> None:
        self.key_id = key_id
        """``env:<n>`` for the n-th key of ``APTIX_API_KEYS``; a database key's id (``key_…``)."""
        self.org_id = org_id
        self.user_id = user_id


def parse_api_keys(raw: str) -> dict[str, ApiKey]:
    """Parse ``key:org_id:user_id`` triples separated by commas.

    Args:
        raw: the value of ``APTIX_API_KEYS``.

    Returns:
        The keys by their secret value; the n-th entry's id is ``env:<n>`` (from 1).

    Raises:
        ValueError: when an entry is not a triple of non-empty parts.
    """
    keys: dict[str, ApiKey] = {}
    entries = [entry for entry in (part.strip() for part in raw.split(",")) if entry]
    for position, entry in enumerate(entries, start=1):
        parts = entry.split(":")
        if len(parts) != 3 or not all(p.strip() for p in parts):
            raise ValueError("APTIX_API_KEYS entries must be key:org_id:user_id triples")
        key, org_id, user_id = (p.strip() for p in parts)
        keys[key] = ApiKey(f"env:{position}", org_id, user_id)
    return keys


class Settings(BaseSettings):
    """The process configuration, read from ``APTIX_*`` environment variables."""

    # hide_input_in_errors: a refused value may be a secret (an API key, a webhook secret); the message
    # says what is wrong without echoing it.
    model_config = SettingsConfigDict(
        env_prefix="APTIX_", extra="ignore", populate_by_name=True, hide_input_in_errors=True
    )

    database_url: str = _EMBEDDED_DATABASE_URL
    """SQLAlchemy URL of the durable store."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis for turn state, locks and idempotency keys: ``redis://``, ``rediss://``, ``unix://``, or
    ``sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]`` for a Sentinel-managed primary
    (``shared.redis_clients``)."""
    broker_url: str | None = None
    """Celery broker; defaults to ``redis_url``. A ``sentinel://`` URL as for ``redis_url``."""
    redis_sentinel_password: SecretStr = SecretStr("")
    """The sentinels' own password, for ``sentinel://`` URLs (a password in the URL is the Redis nodes')."""
    llm_base_url: str = "http://127.0.0.1:8900/v1"
    """Base URL of an OpenAI Responses API server (``…/v1``)."""
    llm_api_key: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("APTIX_LLM_API_KEY", "OPENAI_API_KEY", "llm_api_key"),
    )
    """Bearer key for the LLM server."""
    llm_model: str = "gpt-4.1-mini"
    """Model name sent in each request."""
    llm_timeout_seconds: Annotated[float, Field(gt=0)] = 120.0
    """Timeout of one LLM HTTP call."""
    llm_max_attempts: PositiveInt = 20
    """Calls made for one LLM step before the turn fails; waits while the breaker is open are not calls."""
    llm_retry_budget_seconds: Annotated[float, Field(gt=0)] = 300.0
    """How long one LLM step keeps retrying (429, 5xx, timeouts, connection errors) before the turn fails."""
    llm_breaker_failures: PositiveInt = 5
    """Consecutive failed calls to a model that open its circuit breaker (shared by every worker)."""
    llm_breaker_open_seconds: Annotated[float, Field(gt=0)] = 5.0
    """How long an opened breaker lets no call through; doubles after each failed probe, up to 60 s."""
    api_keys: str = ""
    """Comma-separated ``key:org_id:user_id`` triples the gateway accepts besides the database's keys (``aptix
    keys``): for development and for bootstrapping; read at start."""
    api_key_cache_size: PositiveInt = 10_000
    """Database keys one gateway process remembers once verified (the least recently used go first), and as
    many refused tokens; a remembered key is accepted without the database, during an outage too."""
    api_key_refresh_seconds: Annotated[float, Field(gt=0, le=5)] = 1.0
    """How often each gateway asks the database which keys were created or revoked since it last asked: a new
    or revoked key applies on every gateway within about this long."""
    api_key_verify_seconds: Annotated[float, Field(gt=0)] = 60.0
    """A remembered database key is looked up again on its first use this long after it was verified, and
    its ``last used`` written then (at most once per interval per gateway); when the database does not
    answer, the remembered key is accepted."""
    modes_file: str | None = None
    """YAML mode catalog; the packaged default when unset."""
    max_iterations: PositiveInt = 10
    """LLM calls allowed in one turn."""
    step_lease_seconds: PositiveInt = 30
    """A step whose worker stopped this long ago is run again elsewhere."""
    task_boundaries: TaskBoundaries = DEFAULT_TASK_BOUNDARIES
    """Where a step task ends: ``layer`` (a task per pipeline layer, each shown by Flower), ``queue`` (consecutive
    steps on one queue run in one task: fewer hops, less CPU per turn) or ``call`` (a message only to a model or tool
    call, the pipeline's steps in the task before them; docs/pipeline.md, "Task boundaries")."""
    step_max_deliveries: PositiveInt = 3
    """Deliveries of one step that ran alone in their worker process and whose worker died before the step ended
    (SIGKILL, segfault, out of memory), after which the next delivery fails its turn ``worker_lost`` instead of
    running it; deliveries lost beside other steps do not count (docs/faults.md, "Poison steps")."""
    client_tool_timeout_seconds: PositiveInt = 86400
    """A turn waiting this long for client tool results fails."""
    max_body_bytes: PositiveInt = 4 * 1024 * 1024
    """Larger request bodies are refused with 413."""
    max_batch_requests: PositiveInt = 1000
    """Most requests one ``POST /v1/batches`` may carry."""
    max_upload_requests: PositiveInt = 100_000
    """Most requests (lines) one JSON Lines upload to ``POST /v1/batches`` may carry; more: 422."""
    max_upload_bytes: PositiveInt = 256 * 1024 * 1024
    """Largest JSON Lines upload to ``POST /v1/batches`` (instead of ``max_body_bytes``); larger: 413."""
    history_turns: PositiveInt = 50
    """How many earlier turns of a session a follow-up turn sends as conversation context."""
    reconciler_deadline_seconds: PositiveInt = 60
    """A running turn that made no progress (no step finished, no lease renewed) for this long is re-driven."""
    reconciler_interval_seconds: Annotated[float, Field(gt=0)] = 5.0
    """How often the active reconciler looks for turns past their deadline."""
    reconciler_queued_seconds: PositiveInt = 3600
    """How long a turn's first message may wait in the broker before the reconciler sends it again."""
    reconciler_max_redrives: PositiveInt = 5
    """Re-drives after which a turn that still does not move fails (``internal_error``)."""
    gevent_batch_slots: NonNegativeInt = 1
    """Batch turns' tasks a gevent worker process (the ``llm`` pool) runs at once, each giving its slot up while it
    waits for the model; an interactive turn's task takes none, so it waits behind at most these at each round trip
    (``workers.batch_slots``); 0: no bound."""
    org_max_in_flight: PositiveInt = 128
    """Most turns of one organisation in flight at once: its batch turns past it wait, released round-robin
    across organisations as turns end (docs/batches.md, "Fair admission"); size it to the worker pool."""
    admission_target_delay_ms: Annotated[float, Field(ge=0, le=60_000)] = 0.0
    """The admission window's target: how long the shortest step message of half a second may wait between its
    sending and its task's start before the admission scheduler holds batch turns back (``workers.admission_window``,
    docs/batches.md, "The admission window"); 0 (the default): no window, the organisations' caps alone."""
    tool_threads: PositiveInt = 16
    """Threads a worker process runs server tools on; a handler that overruns its timeout keeps its thread."""
    metrics_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Port on which the gateway serves ``/metrics`` apart from the API (whose ``/metrics`` is then a 404);
    unset: ``/metrics`` is served on the API port."""
    metrics_host: str = "127.0.0.1"
    """Address of the gateway's metrics port (``0.0.0.0`` for a scraper on another host or pod)."""
    worker_metrics_port: Annotated[int, Field(ge=0, le=65535)] = 9191
    """Port on which ``aptix worker`` (and ``aptix reconciler``) serve ``/metrics``; 0 serves none. Two
    workers on one host each need their own."""
    worker_metrics_host: str = "127.0.0.1"
    """Address of the workers' metrics port (``0.0.0.0`` for a scraper on another host or pod)."""
    http_header_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    """A gateway connection must send a request's line and headers within this long (from its opening, or
    from the request's first byte on a kept-alive connection); else 408 and closed."""
    http_body_timeout_seconds: Annotated[float, Field(gt=0)] = 30.0
    """A request's body must have arrived in full this long after its headers; else 408 and closed."""
    http_upload_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0
    """The body deadline of a JSON Lines upload to ``POST /v1/batches`` (instead of ``http_body_timeout_seconds``)."""
    http_keepalive_seconds: PositiveInt = 5
    """The gateway closes a kept-alive connection idle this long (behind a load balancer: above its idle timeout)."""
    http_max_connections: PositiveInt = 1000
    """Connections one gateway process holds at once; one more is answered 503 and closed when accepted."""
    http_max_connections_per_client: Annotated[int, Field(ge=0)] = 64
    """Connections one client address may hold at once on a gateway process (more: 503 and closed); 0 for no
    cap, as behind a proxy, where every connection comes from the proxy's address."""
    db_pool_size: PositiveInt | None = None
    """Database connections a process keeps open; unset: its kind's default (``shared.db.engine.DEFAULT_POOLS``)."""
    db_max_overflow: NonNegativeInt | None = None
    """Connections a process may open beyond its pool under load (closed when returned); unset: its kind's default."""
    redis_max_connections: PositiveInt = 100
    """Connections a process's turn-state Redis client may hold; a command waits for a free one beyond that."""
    worker_health_dir: str | None = None
    """Where ``aptix worker`` writes its heartbeats and ``aptix worker-health`` reads them; unset: a temp folder."""
    worker_heartbeat_stale_seconds: Annotated[float, Field(gt=0)] = 30.0
    """A worker process whose heartbeat (or, while it is connected to the broker, event loop) is this old is hung."""
    worker_task_stuck_seconds: Annotated[float, Field(gt=0)] = 600.0
    """A worker process running one task this long is hung: longer than any step may take (model call, tools)."""
    worker_stop_seconds: Annotated[float, Field(gt=0)] = 50.0
    """How long ``aptix worker``, told to stop (SIGTERM, SIGINT), lets the tasks in hand finish before it ends
    every process it runs (their unacknowledged messages are redelivered); keep it below the orchestrator's grace."""
    log_format: Literal["text", "json"] = "text"
    """How every process writes its log: ``text`` (one readable line per record) or ``json`` (one object per line)."""
    otel_enabled: bool = False
    """Send OpenTelemetry traces, one per turn, to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (off: none is loaded)."""
    webhook_secrets: SecretStr = SecretStr("")
    """Comma-separated ``org_id:whsec_<base64>`` pairs: each organisation's webhook signing secret (Standard
    Webhooks). An organisation without one gets no webhooks."""
    webhook_default_urls: str = ""
    """Comma-separated ``org_id:url`` pairs: where an organisation's events go when their request named no
    ``webhook_url``."""
    webhook_allow_private: bool = False
    """Accept webhook URLs on private, loopback and link-local addresses (tests and development only)."""
    webhook_retry_schedule: str = "5,300,1800,7200,18000,36000,50400"
    """Comma-separated seconds to wait before each retry of a failed webhook delivery (with jitter); after
    the last, the delivery is given up. Default: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h (8 attempts over
    about a day and a quarter)."""
    events_max_per_turn: PositiveInt = 10000
    """About how many events a turn's event log keeps (Redis ``XADD MAXLEN ~``); the oldest go first, so a
    client resuming after a trimmed event misses those."""
    events_max_streams: PositiveInt = 500
    """Event streams (``GET /v1/turns/{id}/events``, ``?stream=true``) one gateway process serves at once;
    one more is answered 503. Each holds a client connection and a Redis connection."""
    events_keepalive_seconds: Annotated[float, Field(gt=0)] = 15.0
    """An event stream with nothing to send for this long sends a comment line (so proxies keep it open)
    and checks that the turn has not ended without its event."""
    openai_wait_seconds: Annotated[float, Field(gt=0, le=3600)] = 300.0
    """How long ``POST /openai/v1/responses`` without ``background`` or ``stream`` waits for its response to
    finish; past it the answer is the response as it stands (``in_progress``), to poll with ``GET``."""
    openai_max_file_bytes: PositiveInt = 200 * 1024 * 1024
    """Largest file ``POST /openai/v1/files`` stores (the file part, not the whole multipart body); larger: 400
    ``file_too_large``. The request body as a whole is bounded by ``max_upload_bytes``."""
    openai_max_file_lines: PositiveInt = 50_000
    """Most non-blank lines a ``batch`` file uploaded to ``POST /openai/v1/files`` may hold; more: 400
    ``too_many_lines``."""
    openai_batch_window_seconds: Annotated[float, Field(gt=0)] = 86_400.0
    """How long the completion window ``24h`` of ``POST /openai/v1/batches`` lasts: a batch's ``expires_at`` is
    its ``created_at`` plus this; requests not finished by then are cancelled (``batch_expired``). Shorten it
    only to test expiry."""
    openai_batch_job_threads: Annotated[int, Field(ge=0, le=16)] = 1
    """How many of the OpenAI face's batch jobs (validating an input file, writing the output and error files
    of a batch that ended) one gateway runs at once, each on a thread of its own; 0: this gateway runs none
    (the others do)."""
    openai_batch_job_lease_seconds: Annotated[float, Field(ge=1, le=3600)] = 30.0
    """How long a gateway holds a batch job without renewing it (it renews every third of this while it
    works): a job whose gateway stopped is taken up by any gateway this long after its last renewal."""
    llm_stream_flush_ms: Annotated[float, Field(ge=0)] = 20.0
    """A turn that streams appends the model's text to its event log as it arrives, at most one
    ``output_text.delta`` per this many milliseconds: deltas arriving sooner are held and go out together
    with the next one, or when their text part ends (fewer appends, coarser pieces); 0 appends each delta."""
    llm_rpm: PositiveInt | None = None
    """Requests per minute the configured model (``llm_model``) may get from all workers together; unset: no
    limit. The mode catalog's ``models`` section sets other models' limits and overrides this one's."""
    llm_tpm: PositiveInt | None = None
    """Tokens per minute (input + output) the configured model may use across all workers; unset: no limit.
    Each call reserves an estimate first and settles with the answer's ``usage``."""

    @field_validator("llm_rpm", "llm_tpm", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        return check_redis_url(value)

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_sentinel_url(value)  # another broker's URL is kombu's to judge
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_api_keys(cls, value: str) -> str:
        parse_api_keys(value)
        return value

    @field_validator("webhook_secrets")
    @classmethod
    def _check_webhook_secrets(cls, value: SecretStr) -> SecretStr:
        parse_secrets(value.get_secret_value())
        return value

    @field_validator("webhook_retry_schedule")
    @classmethod
    def _check_retry_schedule(cls, value: str) -> str:
        parse_retry_schedule(value)
        return value

    @model_validator(mode="after")
    def _defaults_have_secrets(self) -> Settings:
        secrets = parse_secrets(self.webhook_secrets.get_secret_value())
        unsigned = sorted(set(parse_default_urls(self.webhook_default_urls)) - set(secrets))
        if unsigned:
            raise ValueError(
                f"APTIX_WEBHOOK_DEFAULT_URLS names organisation(s) without a secret in APTIX_WEBHOOK_SECRETS: "
                f"{', '.join(unsigned)} (an organisation without a secret gets no webhooks)"
            )
        return self

    @model_validator(mode="after")
    def _check_cluster_urls(self) -> Settings:
        # The state store may be a Redis Cluster; the broker may not (kombu has no cluster transport).
        from shared.redis_cluster import is_cluster_url, parse_cluster_url

        if is_cluster_url(self.redis_url):
            parse_cluster_url(self.redis_url)
            if not self.broker_url:
                raise ValueError(
                    "APTIX_REDIS_URL names a Redis Cluster: set APTIX_BROKER_URL to a single Redis or a Sentinel-"
                    "managed one (the broker cannot run on a cluster)"
                )
        if self.broker_url and is_cluster_url(self.broker_url):
            raise ValueError("APTIX_BROKER_URL cannot name a Redis Cluster (kombu has no cluster transport)")
        return self

    @field_validator("llm_base_url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("APTIX_LLM_BASE_URL must be an http(s) URL")
        return value.rstrip("/")

    @property
    def effective_broker_url(self) -> str:
        """The broker URL, falling back to the Redis URL."""
        return self.broker_url or self.redis_url

    @property
    def sentinel_password(self) -> str | None:
        """``APTIX_REDIS_SENTINEL_PASSWORD``, None when unset: what :mod:`shared.redis_clients` takes."""
        return self.redis_sentinel_password.get_secret_value() or None

    @property
    def state_ttl_seconds(self) -> int:
        """How long Redis keeps a turn's state and event log; past the client-tool timeout the snapshot takes over."""
        return max(86400, self.client_tool_timeout_seconds + 3600)

    @property
    def accepted_api_keys(self) -> dict[str, ApiKey]:
        """The parsed ``APTIX_API_KEYS``."""
        return parse_api_keys(self.api_keys)


OTHER_VARIABLES = frozenset(
    {
        "APTIX_URL",  # the aptix CLI client: the gateway to call
        "APTIX_KEY",  # the aptix CLI client: the API key to send
        "APTIX_LLM_LOCAL_ONLY",  # tests: the model client refuses non-local hosts
        "APTIX_TEST_REDIS_URL",  # tests: the Redis they claim databases on
        "APTIX_TEST_DATABASE_URL",  # tests: the PostgreSQL they create their database on
        "APTIX_FIXTURES_DIR",  # tests: the real-traffic Responses API fixtures (make test sets it)
    }
)
"""``APTIX_*`` variables read by something other than :class:`Settings` (the CLI client, the tests)."""

_PLACEHOLDER_KEYS = frozenset({"dev-key"})
"""API keys that shipped as documented defaults: anyone who read the docs knows them."""


def known_variables() -> frozenset[str]:
    """Every ``APTIX_*`` variable some Aptix process reads."""
    names = {f"APTIX_{name.upper()}" for name in Settings.model_fields}
    return frozenset(names | OTHER_VARIABLES)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One message per ``APTIX_*`` variable in ``environ`` that nothing reads (a misspelling, usually).

    Settings ignore unknown variables, so ``APTIX_MAX_ITERATOINS=3`` would otherwise change nothing
    without a word. Each message names the closest known variable when there is one.

    Args:
        environ: the process environment.

    Returns:
        The messages, sorted by variable name; empty when every variable is known.
    """
    known = known_variables()
    messages = []
    for name in sorted(n for n in environ if n.upper().startswith("APTIX_") and n.upper() not in known):
        # Compare what follows the prefix: the shared "APTIX_" would make any two names look alike.
        close = difflib.get_close_matches(name.upper()[6:], [k[6:] for k in known], n=1, cutoff=0.75)
        hint = f" (did you mean APTIX_{close[0]}?)" if close else ""
        messages.append(f"{name} is not an Aptix setting and is ignored{hint}")
    return messages


def placeholder_api_keys(settings: Settings) -> list[str]:
    """The accepted API keys that are published defaults or template placeholders.

    ``dev-key`` was the documented default of docker-compose.yml, and the Kubernetes Secret template
    says ``CHANGE-ME-KEY``: a gateway that accepts either accepts anyone who read the docs.

    Args:
        settings: the gateway's settings.

    Returns:
        The offending keys, sorted; empty when every key is the operator's own.
    """
    return sorted(key for key in settings.accepted_api_keys if key in _PLACEHOLDER_KEYS or "change-me" in key.lower())


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, read once from the environment."""
    return Settings()
