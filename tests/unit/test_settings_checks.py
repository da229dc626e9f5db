"""Start-up checks: misspelled settings are named, published keys are refused, the schema is waited for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shared.settings import Settings, known_variables, placeholder_api_keys, unknown_variables

REPO = Path(__file__).resolve().parents[2]


def test_unknown_variables_names_a_misspelling_and_its_closest_setting() -> None:
    environ = {"APTIX_MAX_ITERATOINS": "3", "APTIX_MAX_ITERATIONS": "4", "HOME": "/root", "APTIX_WHATEVER": "x"}
    assert unknown_variables(environ) == [
        "APTIX_MAX_ITERATOINS is not an Aptix setting and is ignored (did you mean APTIX_MAX_ITERATIONS?)",
        "APTIX_WHATEVER is not an Aptix setting and is ignored",
    ]


def test_unknown_variables_knows_every_setting_and_the_cli_and_test_variables() -> None:
    environ = dict.fromkeys(known_variables(), "x")
    assert unknown_variables(environ) == []
    assert {"APTIX_DATABASE_URL", "APTIX_TOOL_THREADS", "APTIX_URL", "APTIX_KEY"} <= known_variables()
    assert len(known_variables()) >= len(Settings.model_fields)


def test_placeholder_api_keys_finds_published_defaults_and_template_placeholders() -> None:
    settings = Settings(api_keys="dev-key:o:u,CHANGE-ME-KEY:o:u,9f2c81d7a0b4e3:org:user")
    assert placeholder_api_keys(settings) == ["CHANGE-ME-KEY", "dev-key"]
    assert placeholder_api_keys(Settings(api_keys="9f2c81d7a0b4e3:org:user")) == []


def _aptix(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("APTIX_")}
    return subprocess.run(
        [sys.executable, "-m", "aptix_cli", *args],
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_gateway_refuses_to_start_with_a_placeholder_key(tmp_path: Path) -> None:
    done = _aptix(
        ["gateway", "--port", "1"], {"APTIX_API_KEYS": "CHANGE-ME-KEY:CHANGE-ME-ORG:CHANGE-ME-USER"}, tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert "placeholder" in done.stderr and "APTIX_API_KEYS" in done.stderr


def test_a_process_command_warns_about_a_misspelled_setting(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path}/db.sqlite"
    done = _aptix(["db", "upgrade"], {"APTIX_DATABASE_URL": database, "APTIX_MAX_ITERATOINS": "3"}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "APTIX_MAX_ITERATOINS is not an Aptix setting" in done.stderr
    assert "did you mean APTIX_MAX_ITERATIONS?" in done.stderr


def test_db_wait_gives_up_on_an_unmigrated_database_and_passes_once_migrated(tmp_path: Path) -> None:
    env = {"APTIX_DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite"}
    waited = _aptix(["db", "wait", "--timeout", "0"], env, tmp_path)
    assert waited.returncode == 1, waited.stderr
    assert "never migrated" in waited.stderr and "aptix db upgrade" in waited.stderr
    assert _aptix(["db", "upgrade"], env, tmp_path).returncode == 0
    waited = _aptix(["db", "wait", "--timeout", "0"], env, tmp_path)
    assert waited.returncode == 0, waited.stderr
    assert "database schema at" in waited.stdout
