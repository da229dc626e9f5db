"""The Sentinel example of deploy/sentinel/, validated offline like the other deployment files: the Compose
override against the Compose specification, the ConfigMap strictly against Kubernetes' schemas, and both
against the settings (every process names the sentinels; nothing else changes). The defaults stay one Redis."""

from __future__ import annotations

from pathlib import Path

import yaml

from shared.redis_clients import parse_sentinel_url
from shared.settings import Settings
from tests.unit.test_deploy_files import COMPOSE_FILE, K8S_DIR, _allowed_env_name, _check_compose, _validate_k8s

SENTINEL_DIR = Path(__file__).resolve().parents[2] / "deploy" / "sentinel"
COMPOSE_OVERRIDE = SENTINEL_DIR / "compose.sentinel.yml"
CONFIGMAP = SENTINEL_DIR / "k8s-configmap.yaml"
REDIS_SETTINGS = {"APTIX_REDIS_URL", "APTIX_BROKER_URL", "APTIX_REDIS_SENTINEL_PASSWORD"}


def _yaml(path: Path) -> dict:  # type: ignore[type-arg]
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_compose_override_matches_the_compose_specification() -> None:
    result = _check_compose(COMPOSE_OVERRIDE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_override_points_every_aptix_service_at_the_sentinels_it_adds() -> None:
    base, override = _yaml(COMPOSE_FILE)["services"], _yaml(COMPOSE_OVERRIDE)["services"]
    ours = {name for name, service in base.items() if "image" in service and "aptix" in str(service["image"])}
    using_redis = {name for name in ours if "APTIX_BROKER_URL" in (base[name].get("environment") or {})}
    assert using_redis and using_redis <= set(override)
    for name in using_redis:
        environment = override[name]["environment"]
        assert set(environment) <= REDIS_SETTINGS and all(_allowed_env_name(key) for key in environment), name
        state, broker = (
            parse_sentinel_url(environment["APTIX_REDIS_URL"]),
            parse_sentinel_url(environment["APTIX_BROKER_URL"]),
        )
        assert state is not None and broker is not None, name
        assert {host for host, _port in state.sentinels} == {"sentinel-1", "sentinel-2", "sentinel-3"} <= set(override)
        assert (state.master, state.db, broker.master, broker.db) == ("aptix", 0, "aptix", 1)
    assert "--replicaof" in override["redis-replica"]["command"]
    assert all(
        "sentinel monitor aptix redis 6379 2" in " ".join(override[f"sentinel-{n}"]["command"]) for n in (1, 2, 3)
    )


def test_the_sentinel_configmap_validates_and_differs_from_the_default_only_in_the_redis_urls() -> None:
    result = _validate_k8s([CONFIGMAP])
    assert result.returncode == 0, result.stdout + result.stderr
    default, sentinel = _yaml(K8S_DIR / "configmap.yaml"), _yaml(CONFIGMAP)
    assert sentinel["metadata"] == default["metadata"]
    changed = {
        key
        for key in default["data"].keys() | sentinel["data"].keys()
        if default["data"].get(key) != sentinel["data"].get(key)
    }
    assert changed == {"APTIX_REDIS_URL", "APTIX_BROKER_URL"}
    settings = Settings(redis_url=sentinel["data"]["APTIX_REDIS_URL"], broker_url=sentinel["data"]["APTIX_BROKER_URL"])
    assert parse_sentinel_url(settings.redis_url) is not None and parse_sentinel_url(settings.effective_broker_url)


def test_the_default_deploy_files_keep_a_single_redis() -> None:
    compose = _yaml(COMPOSE_FILE)
    assert "redis" in compose["services"] and not any("sentinel" in name for name in compose["services"])
    assert "sentinel://" not in COMPOSE_FILE.read_text()
    assert all("sentinel://" not in path.read_text() for path in K8S_DIR.glob("*.yaml"))
