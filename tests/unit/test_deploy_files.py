"""Offline validation of the deployment files: docker-compose.yml, deploy/Dockerfile, deploy/k8s/.

The schemas are checked by real validators (the Compose specification's JSON schema through
check-jsonschema, the Kubernetes OpenAPI schemas through kubernetes-validate), run as the
executables installed next to this interpreter. The rest checks the files against the public
contract in shared/API.md: every process runs a documented command, every variable is documented.
No Docker engine or cluster is needed.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from aptix_cli.worker_group import node_name, plan
from aptix_cli.worker_stop import KILL_MARGIN_SECONDS
from shared.settings import Settings, known_variables
from shared.task_names import Queue

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
K8S_DIR = REPO / "deploy" / "k8s"
SECRET_EXAMPLE = REPO / "deploy" / "secret.example.yaml"
IMAGE = "aptix/agent-workers:0.1.0"
KUBERNETES_VERSION = "1.33.0"

K8S_FILES = {
    "namespace.yaml",
    "configmap.yaml",
    "gateway.yaml",
    "worker-pipeline.yaml",
    "worker-llm.yaml",
    "worker-tools.yaml",
    "migrate-job.yaml",
    "flower.yaml",
    "availability.yaml",
    "network-policies.yaml",
    "autoscaling.yaml",
}
CRD_KINDS = {"ScaledObject"}
"""KEDA's kinds: kubernetes-validate does not know them; tests/unit/test_deploy_scaling.py checks them
against KEDA's CRD schema."""

# shared/API.md, "Configuration (environment variables)": the contract says these never change name.
DOCUMENTED_ENV = {
    "APTIX_DATABASE_URL",
    "APTIX_REDIS_URL",
    "APTIX_BROKER_URL",
    "APTIX_LLM_BASE_URL",
    "APTIX_LLM_API_KEY",
    "APTIX_LLM_MODEL",
    "APTIX_API_KEYS",
    "APTIX_MODES_FILE",
    "APTIX_MAX_ITERATIONS",
    "APTIX_STEP_LEASE_SECONDS",
    "APTIX_CLIENT_TOOL_TIMEOUT_SECONDS",
    "APTIX_MAX_BODY_BYTES",
}
QUEUES = {queue.value for queue in Queue}
POOLS = {"prefork", "threads", "gevent", "solo", "eventlet"}


# Read by the deployment's other programs: PostgreSQL's image, Flower, Compose's port binding.
OTHER_ENV = {"FLOWER_BASIC_AUTH", "FLOWER_MAX_TASKS", "GATEWAY_BIND_ADDRESS"}


def _allowed_env_name(name: str) -> bool:
    # Aptix's own names come from Settings itself, so a new setting needs no second list here.
    return name in known_variables() or name in OTHER_ENV or name.startswith("POSTGRES_")


def test_documented_variables_are_settings() -> None:
    assert known_variables() >= DOCUMENTED_ENV


# --------------------------------------------------------------------------- validators


def _tool(name: str) -> Path:
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(
            f"{name} is not installed next to {sys.executable}; run `make test` "
            f"(it installs the test extras, which include {name})",
            pytrace=False,
        )
    return path


def _run(argv: list[str | Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], cwd=REPO, capture_output=True, text=True, timeout=90, check=False)


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return _run([_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", path])


def _k8s_manifests() -> list[Path]:
    return sorted(K8S_DIR.glob("*.yaml"))


def _validate_k8s(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    return _run([_tool("kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION, *paths])


def test_compose_file_matches_the_compose_specification() -> None:
    result = _check_compose(COMPOSE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_validator_rejects_an_unknown_service_key(tmp_path: Path) -> None:
    # Guards against a validator that passes everything (wrong schema, merge keys not resolved).
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    data["services"]["gateway"]["comand"] = ["aptix", "gateway"]
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(yaml.safe_dump(data))
    result = _check_compose(bad)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "comand" in result.stdout + result.stderr


def test_k8s_manifests_are_all_there() -> None:
    assert {p.name for p in _k8s_manifests()} == K8S_FILES


def _core_manifests() -> list[Path]:
    """The manifests of Kubernetes' own kinds (a file that mixes in a CRD kind stays in, and fails)."""
    return [p for p in _k8s_manifests() if not {d["kind"] for d in yaml.safe_load_all(p.read_text()) if d} <= CRD_KINDS]


def test_k8s_manifests_validate_strictly() -> None:
    paths = _core_manifests()
    result = _validate_k8s(paths)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # An unknown kind or apiVersion is only a warning for kubernetes-validate: refuse it here.
    assert "WARN" not in output and "ERROR" not in output, output
    documents = sum(len([d for d in yaml.safe_load_all(p.read_text()) if d]) for p in paths)
    assert output.count(" passed for resource ") == documents, output


def test_secret_example_validates_and_stays_out_of_the_apply_path() -> None:
    result = _validate_k8s([SECRET_EXAMPLE])
    assert result.returncode == 0 and "WARN" not in result.stdout + result.stderr, result.stdout + result.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(SECRET_EXAMPLE.read_text()) if doc]
    assert kinds == ["Secret", "Secret"]
    applied = [file for file, doc in _k8s_docs() if doc["kind"] == "Secret"]
    assert not applied, f"`kubectl apply -f deploy/k8s/` would write placeholder Secrets: {applied}"
    placeholders = [p.name for p in _k8s_manifests() if "change-me" in p.read_text().lower()]
    assert not placeholders, placeholders


def test_compose_publishes_nothing_beyond_localhost_and_has_no_default_keys() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith(("127.0.0.1:", "${GATEWAY_BIND_ADDRESS:-127.0.0.1}:")), (name, port)
    text = COMPOSE_FILE.read_text()
    assert "${APTIX_API_KEYS:?" in text and "${FLOWER_BASIC_AUTH:?" in text
    assert "dev-key" not in text and "change-me" not in text.lower()
    flower = services["flower"]
    assert "basic-auth" not in " ".join(flower["command"]), "Flower reads FLOWER_BASIC_AUTH: keep it off argv"
    assert flower["environment"]["FLOWER_MAX_TASKS"], "Flower's task history is unbounded by default"


def test_k8s_validator_rejects_an_unknown_field(tmp_path: Path) -> None:
    doc = yaml.safe_load((K8S_DIR / "worker-tools.yaml").read_text())
    doc["spec"]["template"]["spec"]["terminationGracePeriodSecs"] = 60
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = _validate_k8s([bad])
    assert result.returncode != 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- the contract


def _compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _dockerfile_cmd() -> list[str]:
    cmd_lines = [ln for ln in DOCKERFILE.read_text().splitlines() if ln.startswith("CMD ")]
    assert len(cmd_lines) == 1, cmd_lines
    return json.loads(cmd_lines[0][len("CMD ") :])


def _argv(command: str | list[str]) -> list[str]:
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if argv[:2] == ["sh", "-c"] and len(argv) == 3:
        argv = shlex.split(argv[2])
        if argv and argv[0] == "exec":
            argv = argv[1:]
    return argv


def _options(args: list[str], where: str) -> dict[str, str]:
    """--name value and --name=value pairs; anything else is an error."""
    options: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        assert arg.startswith("--"), f"{where}: unexpected argument {arg!r}"
        if "=" in arg:
            name, value = arg.split("=", 1)
            i += 1
        else:
            assert i + 1 < len(args), f"{where}: {arg} has no value"
            name, value = arg, args[i + 1]
            i += 2
        options[name] = value
    return options


def _process(command: str | list[str], where: str) -> tuple[str, dict[str, str]]:
    """Which documented process (shared/API.md, "Processes") a command runs, and its options."""
    argv = _argv(command)
    assert argv, f"{where}: empty command"
    if argv[:2] == ["aptix", "gateway"]:
        options = _options(argv[2:], where)
        assert set(options) <= {"--host", "--port"}, f"{where}: {argv}"
        return "gateway", options
    if argv[:2] == ["aptix", "worker"]:
        options = _options(argv[2:], where)
        # --processes is ours (docs/scaling.md, "Worker processes and pools"); the others are API.md's
        assert set(options) <= {"--queues", "--pool", "--concurrency", "--processes", "--hostname"}, f"{where}: {argv}"
        if "--queues" in options:
            assert set(options["--queues"].split(",")) <= QUEUES, f"{where}: {argv}"
        if "--pool" in options:
            assert options["--pool"] in POOLS, f"{where}: {argv}"
        for count in ("--concurrency", "--processes"):
            if count in options:
                assert int(options[count]) > 0, f"{where}: {argv}"
        # A node name per host (%h: the container's or pod's hostname), or Flower shows one worker
        assert "%h" in options.get("--hostname", ""), f"{where}: name the worker with --hostname <name>@%h: {argv}"
        return "worker", options
    if argv == ["aptix", "db", "upgrade"]:
        return "migrate", {}
    if argv[:3] == ["aptix", "db", "wait"]:
        options = _options(argv[3:], where)
        assert set(options) <= {"--timeout"} and float(options.get("--timeout", 1)) > 0, f"{where}: {argv}"
        return "wait-for-schema", options
    if argv[:3] == ["python", "-m", "scripted_llm"]:
        return "scripted-llm", _options(argv[3:], where)
    if argv[0] == "celery" and "flower" in argv:
        at = argv.index("flower")
        assert argv[1:at] == ["-A", "workers.app:celery_app"], f"{where}: Flower runs the project's app: {argv}"
        options = _options(argv[at + 1 :], where)
        # Its password comes from FLOWER_BASIC_AUTH in its environment (checked per file), never argv.
        assert "--basic-auth" not in options, f"{where}: the password would show in `ps`: {argv}"
        # The task list shows each task's args: the envelope, with the turn id
        columns = options.get("--tasks_columns", "").split(",")
        assert "args" in columns, f"{where}: show the args column: {argv}"
        # and each task's result: the steps it ran (inline ones included, docs/pipeline.md "Task boundaries")
        assert "result" in columns, f"{where}: show the result column: {argv}"
        return "flower", options
    raise AssertionError(f"{where}: {argv} is not a process documented in shared/API.md")


def _our_services() -> dict[str, dict]:
    services = _compose()["services"]
    ours = {name: svc for name, svc in services.items() if svc.get("image") == IMAGE or "build" in svc}
    for name, svc in ours.items():
        assert svc.get("image") == IMAGE, f"{name}: image must be {IMAGE}"
        assert svc["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}, name
    return ours


def test_compose_services_run_documented_commands() -> None:
    ours = _our_services()
    kinds = {}
    for name, svc in ours.items():
        kinds[name], _ = _process(svc.get("command", _dockerfile_cmd()), f"docker-compose.yml {name}")
    assert kinds == {
        "migrate": "migrate",
        "gateway": "gateway",
        "worker-pipeline": "worker",
        "worker-llm": "worker",
        "worker-tools": "worker",
        "scripted-llm": "scripted-llm",
        "flower": "flower",
    }
    assert "beat" not in " ".join(_compose()["services"]), "there is no beat schedule yet"


def test_compose_workers_cover_each_queue_once() -> None:
    served: list[str] = []
    pools = {}
    for name, svc in _our_services().items():
        kind, options = _process(svc["command"], name)
        if kind == "worker":
            served += options["--queues"].split(",")
            concurrency = int(options["--concurrency"]) if "--concurrency" in options else None
            processes = int(options["--processes"]) if "--processes" in options else None
            for spec in plan(options["--queues"], options.get("--pool"), concurrency, processes):
                pools.update(dict.fromkeys(spec.queues.split(","), (spec.pool, spec.concurrency)))
    assert sorted(served) == sorted(QUEUES)
    # LLM calls are I/O-bound: the compose file gives the llm queue the pool that keeps 2,000 in flight
    assert pools["llm"][0] == "gevent" and pools["llm"][1] >= 2000
    # Webhook deliveries wait on clients' endpoints: an I/O pool too, never a pipeline thread
    assert pools["webhooks"][0] == "gevent"


def _compose_env_names(svc: dict) -> set[str]:
    env = svc.get("environment") or {}
    if isinstance(env, dict):
        return set(env)
    return {item.split("=", 1)[0] for item in env}


def test_compose_environment_is_documented() -> None:
    services = _compose()["services"]
    names = set().union(*(_compose_env_names(svc) for svc in services.values()))
    assert names, "no environment at all?"
    undocumented = sorted(n for n in names if not _allowed_env_name(n))
    assert not undocumented, f"not in shared/API.md: {undocumented}"
    # Variables interpolated from the operator's shell or .env ($$ is an escaped literal $).
    text = COMPOSE_FILE.read_text()
    interpolated = set(re.findall(r"(?<!\$)\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))
    undocumented = sorted(n for n in interpolated if not _allowed_env_name(n))
    assert not undocumented, f"interpolated but not documented: {undocumented}"
    gateway = _compose_env_names(services["gateway"])
    assert {"APTIX_DATABASE_URL", "APTIX_REDIS_URL", "APTIX_BROKER_URL", "APTIX_API_KEYS"} <= gateway


def test_compose_gateway_waits_for_migrations_and_flower_stays_local() -> None:
    services = _compose()["services"]
    assert services["migrate"]["restart"] == "no"
    depends = services["gateway"]["depends_on"]
    assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert depends["redis"]["condition"] == "service_healthy"
    for port in services["flower"].get("ports", []):
        assert str(port).startswith("127.0.0.1:"), f"Flower's /metrics has no auth: {port!r}"


# --------------------------------------------------------------------------- Kubernetes


def _k8s_docs() -> list[tuple[str, dict]]:
    return [(p.name, doc) for p in _k8s_manifests() for doc in yaml.safe_load_all(p.read_text()) if doc]


def _pod_specs() -> list[tuple[str, dict]]:
    return [
        (f"{file} {doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"])
        for file, doc in _k8s_docs()
        if doc["kind"] in {"Deployment", "Job"}
    ]


def test_k8s_pods_run_documented_commands_as_non_root() -> None:
    served: list[str] = []
    kinds = set()
    for where, pod in _pod_specs():
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        for container in pod["containers"]:
            assert container["image"] == IMAGE, where
            assert "resources" in container, where
            kind, options = _process(container["command"], where)
            kinds.add(kind)
            if kind == "worker":
                served += options["--queues"].split(",")
                assert pod["terminationGracePeriodSeconds"] >= 60, f"{where}: warm shutdown"
    assert sorted(served) == sorted(QUEUES)
    assert kinds == {"gateway", "worker", "migrate", "flower"}


def test_every_worker_ends_itself_before_its_grace_period_runs_out() -> None:
    # APTIX_WORKER_STOP_SECONDS, plus the margin `aptix worker` gives its children, within the grace period
    default = Settings.model_fields["worker_stop_seconds"].default
    checked = 0
    for file in (COMPOSE_FILE, REPO / "deploy" / "compose.worker-host.yml"):
        for name, svc in yaml.safe_load(file.read_text())["services"].items():
            if svc.get("command", [None, None])[:2] == ["aptix", "worker"]:
                stop = float((svc.get("environment") or {}).get("APTIX_WORKER_STOP_SECONDS", default))
                grace = float(svc["stop_grace_period"].removesuffix("s"))
                assert stop + KILL_MARGIN_SECONDS < grace, f"{file.name} {name}"
                checked += 1
    for where, pod in _pod_specs():
        for container in pod["containers"]:
            if container["command"][:2] == ["aptix", "worker"]:
                env = {item["name"]: item.get("value") for item in container.get("env", [])}
                stop = float(env.get("APTIX_WORKER_STOP_SECONDS", default))
                assert stop + KILL_MARGIN_SECONDS < pod["terminationGracePeriodSeconds"], where
                checked += 1
    assert checked == 9


def _serving_deployments() -> dict[str, dict]:
    return {
        doc["metadata"]["name"]: doc
        for _, doc in _k8s_docs()
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] != "aptix-flower"
    }


def test_k8s_every_gateway_and_worker_deployment_survives_a_drain_and_spreads_out() -> None:
    deployments = _serving_deployments()
    assert set(deployments) == {"aptix-gateway", "aptix-worker-pipeline", "aptix-worker-llm", "aptix-worker-tools"}
    budgets = {
        doc["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]: doc["spec"]
        for _, doc in _k8s_docs()
        if doc["kind"] == "PodDisruptionBudget"
    }
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == name
        budget = budgets[name]
        assert budget.get("minAvailable", 0) >= 1 or budget.get("maxUnavailable") == 1, name
        spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert {c["topologyKey"] for c in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
        assert all(c["labelSelector"]["matchLabels"] == {"app.kubernetes.io/name": name} for c in spread), name


def test_k8s_network_policies_deny_ingress_except_the_gateway_api_port() -> None:
    policies = [doc["spec"] for _, doc in _k8s_docs() if doc["kind"] == "NetworkPolicy"]
    deny = [p for p in policies if p["podSelector"] == {}]
    assert deny and deny[0]["policyTypes"] == ["Ingress"] and not deny[0].get("ingress"), "default deny"
    # Open to all: only the gateway's API port. (The metrics ports: see the metrics test below.)
    open_to_all = [p for p in policies if p["podSelector"] != {} and not _metrics_policy(p)]
    assert [p["podSelector"]["matchLabels"] for p in open_to_all] == [{"app.kubernetes.io/name": "aptix-gateway"}]
    assert open_to_all[0]["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    gateway = _serving_deployments()["aptix-gateway"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in gateway["ports"]


def _metrics_policy(policy: dict) -> bool:
    return all(port.get("port") == "metrics" for rule in policy.get("ingress", []) for port in rule.get("ports", []))


_METRICS_SETTINGS = {
    "gateway": ("APTIX_METRICS_HOST", "APTIX_METRICS_PORT"),
    "worker": ("APTIX_WORKER_METRICS_HOST", "APTIX_WORKER_METRICS_PORT"),
}
"""The settings that put a process's metrics on their own port (docs/operations.md, "Metrics")."""


def test_k8s_every_deployment_exposes_its_metrics_port_and_only_the_monitoring_side_reaches_it() -> None:
    docs = _k8s_docs()
    for name, deployment in _serving_deployments().items():
        template = deployment["spec"]["template"]
        container = template["spec"]["containers"][0]
        kind, _ = _process(container["command"], name)
        host_name, port_name = _METRICS_SETTINGS[kind]
        # The process is told to serve its metrics on every interface of the pod, on its metrics port
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        assert env.get(host_name) == "0.0.0.0", f"{name}: {host_name}"
        port = int(env[port_name])
        ports = {p["name"]: p for p in container["ports"]}
        assert ports["metrics"] == {"name": "metrics", "containerPort": port, "protocol": "TCP"}, name
        # And Prometheus's annotations name that port, not the API's
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(port), name
        assert annotations["prometheus.io/path"] == "/metrics", name
        # And no Service publishes it
        labels = template["metadata"]["labels"].items()
        services = [d for _, d in docs if d["kind"] == "Service" and d["spec"]["selector"].items() <= labels]
        assert kind == "worker" or services, f"{name}: no Service selects the gateway?"
        for service in services:
            published = {str(p.get("targetPort")) for p in service["spec"]["ports"]}
            published |= {str(p["port"]) for p in service["spec"]["ports"]}
            assert not published & {"metrics", str(port)}, f"{service['metadata']['name']} publishes metrics"
    assert not [doc for _, doc in docs if doc["kind"] == "Ingress"], "an Ingress would publish the gateway"
    # The policy that opens the metrics ports opens nothing else, and only to the monitoring namespace
    policies = [doc["spec"] for _, doc in docs if doc["kind"] == "NetworkPolicy" and _metrics_policy(doc["spec"])]
    policies = [p for p in policies if p.get("ingress")]
    assert len(policies) == 1, policies
    selector = policies[0]["podSelector"]["matchExpressions"]
    assert selector == [{"key": "app.kubernetes.io/component", "operator": "In", "values": ["gateway", "worker"]}]
    for rule in policies[0]["ingress"]:
        assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        assert [list(peer) for peer in rule["from"]] == [["namespaceSelector"]], "from the monitoring namespace only"
    flower = next(d for _, d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "aptix-flower")
    assert flower["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] not in {"gateway", "worker"}


def test_compose_serves_metrics_on_their_own_ports_and_publishes_none() -> None:
    services = _compose()["services"]
    for name, svc in _our_services().items():
        kind, _ = _process(svc["command"], name)
        if kind not in _METRICS_SETTINGS:
            continue
        host_name, port_name = _METRICS_SETTINGS[kind]
        env = svc["environment"]
        assert env[host_name] == "0.0.0.0", f"{name}: {host_name}"
        assert [str(p) for p in svc["expose"]] == [env[port_name]], name
        published = [str(p).rsplit(":", 1)[-1] for p in services[name].get("ports", [])]
        assert env[port_name] not in published, f"{name} publishes its metrics port"


def test_k8s_gateway_and_workers_wait_for_the_schema_before_starting() -> None:
    for where, pod in _pod_specs():
        commands = [_process(c["command"], where)[0] for c in pod["containers"]]
        if {"gateway", "worker"} & set(commands):
            init = pod.get("initContainers", [])
            assert [_process(c["command"], where)[0] for c in init] == ["wait-for-schema"], where
            assert init[0]["securityContext"]["readOnlyRootFilesystem"] is True, where
            assert init[0]["envFrom"] == pod["containers"][0]["envFrom"], f"{where}: same database"


def test_k8s_environment_is_documented() -> None:
    names: set[str] = set()
    secrets = [("secret.example.yaml", doc) for doc in yaml.safe_load_all(SECRET_EXAMPLE.read_text()) if doc]
    for _, doc in [*_k8s_docs(), *secrets]:
        if doc["kind"] == "ConfigMap":
            names |= set(doc["data"])
        if doc["kind"] == "Secret":
            names |= set(doc.get("stringData", {})) | set(doc.get("data", {}))
    for _, pod in _pod_specs():
        for container in pod["containers"]:
            names |= {e["name"] for e in container.get("env", [])}
    undocumented = sorted(n for n in names if not _allowed_env_name(n))
    assert not undocumented, f"not in shared/API.md: {undocumented}"


def test_k8s_gateway_probes_and_flower_is_cluster_internal() -> None:
    docs = {(doc["kind"], doc["metadata"]["name"]): doc for _, doc in _k8s_docs()}
    gateway = docs[("Deployment", "aptix-gateway")]
    assert gateway["spec"]["replicas"] == 2
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert docs[("Service", "aptix-flower")]["spec"].get("type", "ClusterIP") == "ClusterIP"
    flower = docs[("Deployment", "aptix-flower")]["spec"]["template"]["spec"]["containers"][0]
    assert {"FLOWER_BASIC_AUTH", "FLOWER_MAX_TASKS"} <= {e["name"] for e in flower["env"]}
    assert not [key for key in docs if key[0] == "Ingress"], "never expose Flower directly"


# --------------------------------------------------------------------------- the image


def test_dockerfile_builds_every_package_and_runs_the_gateway_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim\b", text, re.M)
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    assert stages == [("${PYTHON_IMAGE}", "build"), ("${PYTHON_IMAGE}", "")], "a build stage, then a clean one"
    # Exactly the locked dependencies, by hash; the project itself adds none.
    assert "pip install --require-hashes -r requirements/runtime.lock" in text
    assert "pip install --no-deps ." in text
    assert "[test]" not in text and "requirements/test.lock" not in text, "no test extras in the image"
    assert "COPY --from=build /opt/aptix /opt/aptix" in text
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user and user[-1].split(":")[0].isdigit() and user[-1].split(":")[0] != "0", (
        "a numeric non-root USER (Kubernetes runAsNonRoot can only verify a numeric one)"
    )
    assert re.search(r"^EXPOSE 8000\b", text, re.M)
    assert re.search(r"^HEALTHCHECK\b.*\\\n.*urllib.*/healthz", text, re.M)
    assert _process(_dockerfile_cmd(), "Dockerfile CMD")[0] == "gateway"
    # Every package that pyproject.toml installs is copied into the build context.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    includes = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY\s+(\S+)\s", text, re.M))
    packages = {pattern.rstrip("*").rstrip(".") for pattern in includes}
    missing = sorted(p for p in packages if p not in copied)
    assert not missing, f"deploy/Dockerfile does not COPY {missing}"
    # And the build context holds what it copies, but not the virtualenv, git or the tests.
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "tests"} <= ignored
    assert not (copied - {"--from=build"}) & ignored


def _lock_pins(path: Path) -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", path.read_text(), re.M)
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins}


def test_locks_pin_every_dependency_with_hashes() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = _lock_pins(REPO / "requirements" / "runtime.lock")
    test = _lock_pins(REPO / "requirements" / "test.lock")
    for requirement in pyproject["dependencies"]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~ ;]", requirement)[0]).lower()
        assert name in runtime and runtime[name] == test.get(name), f"{name}: run `make lock`"
    for requirement in pyproject["optional-dependencies"]["test"]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~ ;]", requirement)[0]).lower()
        assert name in test and name not in runtime, name
    for lock in ("runtime.lock", "test.lock"):
        text = (REPO / "requirements" / lock).read_text()
        assert not re.findall(r"^[A-Za-z0-9_.\-]+\s*(>=|<=|~=|>|<)", text, re.M), f"{lock}: only exact pins"
        assert len(re.findall(r"^[A-Za-z0-9_.\-]+==", text, re.M)) <= text.count("--hash=sha256:"), lock


# Flower: every worker named apart, every Flower command with the turn id in its task list


def test_every_worker_command_names_each_of_its_processes_apart_in_every_deploy_file_and_guide() -> None:
    commands = {
        "docker-compose.yml": [(name, svc["command"]) for name, svc in _our_services().items()],
        "deploy/k8s": [(where, c["command"]) for where, pod in _pod_specs() for c in pod["containers"]],
        "deploy/README.md": _shell_commands(REPO / "deploy" / "README.md"),
    }
    # Every guide's commands, each guide on its own: the README and the guides under docs/.
    for guide in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        commands[str(guide.relative_to(REPO))] = _shell_commands(guide)
    for source, found in commands.items():
        names: list[str] = []
        for where, command in found:
            kind, options = _process(command, f"{source} {where}")  # a worker's --hostname has %h
            if kind == "worker":
                concurrency = int(options["--concurrency"]) if "--concurrency" in options else None
                processes = int(options["--processes"]) if "--processes" in options else None
                queues = options.get("--queues", "pipeline,llm,tools")
                specs = plan(queues, options.get("--pool"), concurrency, processes)
                names += [node_name(s, options["--hostname"], pid=1, grouped=len(specs) > 1) for s in specs]
        # Then no two worker processes of one deployment share a Celery node name on a host
        assert len(names) == len(set(names)), f"{source}: {names}"
    # docs/operations.md starts Flower next to plain-process workers
    assert any(kind == "flower" for kind, _ in (_process(c, w) for w, c in commands["docs/operations.md"]))


def _shell_commands(path: Path) -> list[tuple[str, str]]:
    """The ``aptix worker`` and ``celery`` commands of a Markdown file's shell code blocks, as typed."""
    commands = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", path.read_text(), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip().removesuffix("&").strip()
            if command.startswith(("aptix worker", "celery ")):
                commands.append((f"{path.name}: {command}", command))
    return commands


# --------------------------------------------------------------------------- the Redis Cluster example

CLUSTER_EXAMPLE = REPO / "deploy" / "compose.redis-cluster.yml"


def test_the_redis_cluster_example_validates_and_moves_only_the_state_store_to_the_cluster() -> None:
    from shared.redis_cluster import is_cluster_url, parse_cluster_url

    # Given the override beside the default file, which keeps its single Redis for both
    result = _check_compose(CLUSTER_EXAMPLE)
    assert result.returncode == 0, result.stdout + result.stderr
    base, example = _compose()["services"], yaml.safe_load(CLUSTER_EXAMPLE.read_text())["services"]
    assert base["gateway"]["environment"]["APTIX_REDIS_URL"] == "${APTIX_REDIS_URL:-redis://redis:6379/0}"
    # Then it runs six cluster nodes, formed with a replica each, nothing published
    nodes = {name: svc for name, svc in example.items() if name.startswith("redis-node-")}
    assert len(nodes) == 6 and not any("ports" in svc for svc in example.values())
    for svc in nodes.values():
        command = svc["command"]
        assert (
            command[command.index("--cluster-enabled") + 1] == "yes"
            and int(command[command.index("--port") + 1]) < 55535
        )
    create = " ".join(example["redis-cluster-create"]["command"])
    assert "--cluster create" in create and "--cluster-replicas 1" in create and "for n in 1 2 3 4 5 6" in create
    assert set(example["redis-cluster-create"]["depends_on"]) == set(nodes)
    # and every Aptix process with a state store gets a cluster URL naming nodes that exist, after it is formed
    aptix = {name for name, svc in base.items() if "APTIX_REDIS_URL" in _compose_env_names(svc)}
    assert {"migrate", "gateway", "worker-pipeline", "worker-llm", "worker-tools"} <= aptix
    for name in aptix:
        url = example[name]["environment"]["APTIX_REDIS_URL"]
        assert is_cluster_url(url) and {host for host, _ in parse_cluster_url(url).nodes} <= set(nodes), name
        assert name in ("migrate", "scripted-llm") or "redis-cluster-create" in example[name]["depends_on"], name
        # the broker stays the default file's single Redis, and the settings accept the pair
        broker = base[name]["environment"]["APTIX_BROKER_URL"].split(":-", 1)[1].rstrip("}")
        assert "APTIX_BROKER_URL" not in example[name]["environment"] and not is_cluster_url(broker)
        Settings(redis_url=url, broker_url=broker)
