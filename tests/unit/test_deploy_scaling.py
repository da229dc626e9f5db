"""Scaling and capacity of the deployment files, offline.

KEDA's ScaledObjects are checked against KEDA's own CRD schema (the pydantic models that
``cloudcoil-models-keda`` generates from it), made strict: those models accept unknown fields, so a
misspelled ``maxReplicaCuont`` would pass them and be dropped by the cluster without a word. Each
worker Deployment scales on its own queue's whole backlog. The PostgreSQL connections every process
may open, at full scale and during a rollout, are added up from the manifests and the code's own
pool sizes, and must stay under PostgreSQL's default ``max_connections``. Worker probes run
``aptix worker-health``, and the worker-host Compose file is checked like docker-compose.yml.
"""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject

from aptix_cli.worker_group import plan
from shared.db.engine import ProcessKind, pool_size_for
from shared.settings import Settings
from tests.unit.test_deploy_files import (
    COMPOSE_FILE,
    IMAGE,
    REPO,
    _allowed_env_name,
    _check_compose,
    _k8s_docs,
    _process,
)

WORKER_HOST_FILE = REPO / "deploy" / "compose.worker-host.yml"
DEPLOY_README = REPO / "deploy" / "README.md"
SCALING_GUIDE = REPO / "docs" / "scaling.md"
"""The guide that owns "Adding a worker host"."""

POSTGRES_MAX_CONNECTIONS = 100
POSTGRES_RESERVED = 3
"""PostgreSQL's defaults: ``max_connections`` and ``superuser_reserved_connections``."""

PROMETHEUS_SCALER_KEYS = {
    "serverAddress", "query", "threshold", "activationThreshold", "namespace", "customHeaders",
    "ignoreNullValues", "queryParameters", "unsafeSsl", "timeout", "authModes",
}  # fmt: skip
"""The trigger metadata KEDA's prometheus scaler reads (keda.sh/docs/scalers/prometheus): a trigger's
metadata is a free string map in the CRD, so the schema cannot catch a misspelled key there."""

HEALTH_COMMAND = ["aptix", "worker-health"]


# --------------------------------------------------------------------------- KEDA


def _strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that lists its properties."""
    if isinstance(schema, dict):
        strict = {key: _strict(value) for key, value in schema.items()}
        if "properties" in strict and "additionalProperties" not in strict:
            strict["additionalProperties"] = False
        return strict
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


_VALIDATOR = jsonschema.Draft202012Validator(_strict(ScaledObject.model_json_schema(by_alias=True)))


def keda_errors(doc: dict[str, Any]) -> list[str]:
    """Every way ``doc`` breaks KEDA's ScaledObject schema, unknown fields included."""
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _VALIDATOR.iter_errors(doc))


def _scaled_objects() -> list[dict[str, Any]]:
    return [doc for _, doc in _k8s_docs() if doc["kind"] == "ScaledObject"]


def _worker_deployments() -> dict[str, dict[str, Any]]:
    return {
        doc["metadata"]["name"]: doc
        for _, doc in _k8s_docs()
        if doc["kind"] == "Deployment" and doc["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    }


def test_scaled_objects_match_kedas_crd_schema_strictly() -> None:
    objects = _scaled_objects()
    assert objects
    for doc in objects:
        assert keda_errors(doc) == [], doc["metadata"]["name"]
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        ScaledObject.model_validate(doc)


def test_the_strict_keda_check_rejects_a_misspelled_field() -> None:
    # Given a ScaledObject with a misspelled field at the top of the spec and one inside a trigger
    bad = copy.deepcopy(_scaled_objects()[0])
    bad["spec"]["maxReplicaCuont"] = 40
    bad["spec"]["triggers"][0]["metricTyp"] = "Value"
    # Then KEDA's generated models alone accept it (unknown fields are ignored) ...
    ScaledObject.model_validate(bad)
    # ... and the strict check names both fields
    errors = "\n".join(keda_errors(bad))
    assert "'maxReplicaCuont' was unexpected" in errors and "'metricTyp' was unexpected" in errors, errors


def test_every_worker_deployment_scales_on_its_own_queues_whole_backlog() -> None:
    objects = {doc["spec"]["scaleTargetRef"]["name"]: doc for doc in _scaled_objects()}
    deployments = _worker_deployments()
    assert set(objects) == set(deployments) == {"aptix-worker-pipeline", "aptix-worker-llm", "aptix-worker-tools"}
    for name, deployment in deployments.items():
        spec = objects[name]["spec"]
        queue = deployment["metadata"]["labels"]["aptix.io/queue"]
        _, options = _process(deployment["spec"]["template"]["spec"]["containers"][0]["command"], name)
        queues = options["--queues"].split(",")
        assert queues[0] == queue, name  # the Deployment is named for its first queue (llm also serves webhooks)
        # KEDA owns the replica count: a replicas field would be reset by every `kubectl apply`.
        assert "replicas" not in deployment["spec"], f"{name}: leave the replicas to KEDA"
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], name
        assert spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"], name
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus" and trigger.get("metricType", "AverageValue") == "AverageValue"
        metadata = trigger["metadata"]
        assert set(metadata) <= PROMETHEUS_SCALER_KEYS, f"{name}: {set(metadata) - PROMETHEUS_SCALER_KEYS}"
        assert {"serverAddress", "query", "threshold"} <= set(metadata), name
        assert float(metadata["threshold"]) > 0 and metadata["ignoreNullValues"] == "false", name
        query = metadata["query"]
        # Its queues only, both states (waiting in every priority list, in progress), max over gateways.
        selector = f'queue="{queue}"' if len(queues) == 1 else f'queue=~"{"|".join(queues)}"'
        assert query == f'max(sum by (instance) (aptix_queue_depth{{namespace="aptix", {selector}}}))', query


# --------------------------------------------------------------------------- PostgreSQL connections


def _env(container: dict[str, Any], configmap: dict[str, str]) -> dict[str, str]:
    env = dict(configmap)
    env.update({item["name"]: item["value"] for item in container.get("env", []) if "value" in item})
    return env


def _process_connections(container: dict[str, Any], configmap: dict[str, str], where: str) -> int:
    """The most connections one container opens: processes x (pool + overflow) of its kind."""
    kind, options = _process(container["command"], where)
    env = _env(container, configmap)
    settings = Settings(db_pool_size=env.get("APTIX_DB_POOL_SIZE"), db_max_overflow=env.get("APTIX_DB_MAX_OVERFLOW"))  # type: ignore[arg-type]  # pydantic parses the strings, as from the environment
    if kind == "worker":
        concurrency = int(options["--concurrency"]) if "--concurrency" in options else None
        processes = int(options["--processes"]) if "--processes" in options else None
        count = len(plan(options.get("--queues", "pipeline,llm,tools"), options.get("--pool"), concurrency, processes))
        return count * pool_size_for(settings, ProcessKind.WORKER).most
    process_kinds = {
        "gateway": ProcessKind.GATEWAY, "migrate": ProcessKind.MIGRATION, "wait-for-schema": ProcessKind.MIGRATION
    }  # fmt: skip
    if kind in process_kinds:
        return pool_size_for(settings, process_kinds[kind]).most
    assert kind == "flower", f"{where}: does {kind} use the database?"
    return 0


def connection_budget(docs: list[dict[str, Any]]) -> dict[str, int]:
    """The PostgreSQL connections each workload may hold at once, at its largest.

    A Deployment's pods: its replicas (KEDA's ``maxReplicaCount`` when it scales it) plus the pods
    a rollout or a drain adds (``maxSurge``, Kubernetes' 25 % rounded up by default). A pod holds
    its init containers' connections or its containers', never both.
    """
    configmap = next(doc["data"] for doc in docs if doc["kind"] == "ConfigMap")
    ceilings = {doc["spec"]["scaleTargetRef"]["name"]: doc["spec"]["maxReplicaCount"] for doc in docs
                if doc["kind"] == "ScaledObject"}  # fmt: skip
    budget = {}
    for doc in docs:
        if doc["kind"] not in {"Deployment", "Job"}:
            continue
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        pod = doc["spec"]["template"]["spec"]
        per_pod = max(
            sum(_process_connections(c, configmap, name) for c in pod["containers"]),
            max((_process_connections(c, configmap, name) for c in pod.get("initContainers", [])), default=0),
        )
        if doc["kind"] == "Job":
            pods = doc["spec"].get("parallelism", 1)
        else:
            replicas = max(doc["spec"].get("replicas", 1), ceilings.get(doc["metadata"]["name"], 0))
            surge = doc["spec"].get("strategy", {}).get("rollingUpdate", {}).get("maxSurge", "25%")
            pods = replicas + (math.ceil(replicas * int(surge[:-1]) / 100) if isinstance(surge, str) else surge)
        budget[name] = pods * per_pod
    return budget


def test_postgres_connections_at_full_scale_stay_under_max_connections() -> None:
    budget = connection_budget([doc for _, doc in _k8s_docs()])
    total = sum(budget.values())
    assert total <= POSTGRES_MAX_CONNECTIONS - POSTGRES_RESERVED, budget
    assert budget["Deployment/aptix-worker-pipeline"] > 0 and budget["Deployment/aptix-flower"] == 0, budget
    # The arithmetic deploy/README.md shows is this one.
    text = DEPLOY_README.read_text()
    assert f"**{total} connections**" in text, f"deploy/README.md should say **{total} connections**: {budget}"
    for name, connections in budget.items():
        row = rf"^\| `{name.split('/')[1]}`[^\n]*\| {connections} \|$"
        assert re.search(row, text, re.M), f"deploy/README.md: no table row for {name} ending in {connections}"


def test_the_connection_budget_counts_keda_ceilings_processes_and_pools() -> None:
    docs = [copy.deepcopy(doc) for _, doc in _k8s_docs()]
    before = sum(connection_budget(docs).values())
    # Raising a KEDA ceiling or a pool raises the total, past the limit when far enough
    for doc in docs:
        if doc["kind"] == "ScaledObject" and doc["metadata"]["name"] == "aptix-worker-llm":
            doc["spec"]["maxReplicaCount"] = 30
    assert sum(connection_budget(docs).values()) > POSTGRES_MAX_CONNECTIONS
    docs = [copy.deepcopy(doc) for _, doc in _k8s_docs()]
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "aptix-worker-pipeline":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            container["env"] = [{"name": "APTIX_DB_MAX_OVERFLOW", "value": "5"}]
            container["command"][container["command"].index("--processes") + 1] = "3"
    assert sum(connection_budget(docs).values()) > before


# --------------------------------------------------------------------------- worker health probes


def test_every_worker_is_probed_with_aptix_worker_health() -> None:
    for name, deployment in _worker_deployments().items():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        for probe in ("startupProbe", "livenessProbe"):
            assert container[probe]["exec"]["command"] == HEALTH_COMMAND, (name, probe)
        # One failed check is not a restart; the check itself already waits out the stale limit.
        assert container["livenessProbe"]["failureThreshold"] >= 2, name
    for path in (COMPOSE_FILE, WORKER_HOST_FILE):
        services = _our_services(path)
        workers = {name: svc for name, svc in services.items() if _process(svc["command"], name)[0] == "worker"}
        assert workers, path
        for name, service in workers.items():
            assert service["healthcheck"]["test"] == ["CMD", *HEALTH_COMMAND], (path.name, name)
            assert not service["healthcheck"].get("disable"), (path.name, name)
    done = subprocess.run(
        [sys.executable, "-m", "aptix_cli", "worker-health", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- a worker-only host


def _worker_host() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKER_HOST_FILE.read_text())
    return data


def test_worker_host_file_matches_the_compose_specification() -> None:
    result = _check_compose(WORKER_HOST_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_worker_host_runs_the_same_workers_as_the_main_host_and_nothing_else() -> None:
    services = _worker_host()["services"]
    main = _our_services(COMPOSE_FILE)

    def workers(found: dict[str, Any], where: str) -> dict[str, tuple[str, int]]:
        shapes = {}
        for name, svc in found.items():
            kind, options = _process(svc["command"], f"{where} {name}")
            if kind != "worker":
                continue
            assert options["--hostname"].endswith("@%h"), f"{where} {name}: a node name unique on every host"
            concurrency = int(options["--concurrency"]) if "--concurrency" in options else None
            processes = int(options["--processes"]) if "--processes" in options else None
            for spec in plan(options["--queues"], options.get("--pool"), concurrency, processes):
                shapes[spec.queues] = (spec.pool, spec.concurrency)
        return shapes

    assert set(services) == {"worker-pipeline", "worker-llm", "worker-tools"}
    assert workers(services, WORKER_HOST_FILE.name) == workers(main, COMPOSE_FILE.name)
    for name, service in services.items():
        assert service["image"] == IMAGE and service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
        assert "ports" not in service and "depends_on" not in service, f"{name}: workers only, on shared services"
        assert service["restart"] == "unless-stopped", name


def test_worker_host_requires_the_shared_services_and_documents_its_variables() -> None:
    text = WORKER_HOST_FILE.read_text()
    for required in ("APTIX_DATABASE_URL", "APTIX_REDIS_URL", "APTIX_BROKER_URL", "APTIX_LLM_BASE_URL"):
        assert "${" + required + ":?" in text, f"{required} must be set on a worker host (no local default)"
    names = set(next(iter(_worker_host()["services"].values()))["environment"])
    interpolated = set(re.findall(r"(?<!\$)\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))
    assert not sorted(n for n in names | interpolated if not _allowed_env_name(n))
    section = SCALING_GUIDE.read_text().split("\n## Adding a worker host\n", 1)[1].split("\n## ", 1)[0]
    assert "docker compose -f deploy/compose.worker-host.yml up" in section
    for name in interpolated:
        assert name in section, f"docs/scaling.md, 'Adding a worker host', does not mention {name}"


@pytest.mark.parametrize("path", [COMPOSE_FILE, WORKER_HOST_FILE], ids=lambda p: p.name)
def test_compose_workers_set_their_connection_pools(path: Path) -> None:
    for name, service in _our_services(path).items():
        if _process(service["command"], name)[0] in {"worker", "gateway"}:
            assert {"APTIX_DB_POOL_SIZE", "APTIX_DB_MAX_OVERFLOW"} <= set(service["environment"]), (path.name, name)


def _our_services(path: Path) -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(path.read_text())["services"]
    return {name: svc for name, svc in services.items() if svc.get("image") == IMAGE and "command" in svc}
