"""Architecture rules: the gateway never imports workers; the step map, tasks and modules agree."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from shared.result import ErrorCode
from shared.settings import Settings
from shared.task_names import task_name
from workers.app import create_celery
from workers.step_map import STEP_MAP

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED_ERROR_CODES = {
    "invalid_request", "session_not_found", "session_busy", "unknown_tool", "tool_failed", "llm_error",
    "llm_rate_limited", "iteration_limit", "continuation_mismatch", "client_tool_timeout", "cancelled",
    "internal_error", "worker_lost",
}  # fmt: skip  # ARCHITECTURE.md, "Errors"; worker_lost: docs/api.md (issue 25, poison steps)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_gateway_never_imports_workers() -> None:
    for path in (ROOT / "api_gateway").rglob("*.py"):
        assert not any(name.split(".")[0] == "workers" for name in _imports(path)), path
    code = "import sys, api_gateway.app; print(any(m.split('.')[0] == 'workers' for m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert loaded.stdout.strip() == "False"


def test_shared_imports_nothing_of_ours() -> None:
    for path in (ROOT / "shared").rglob("*.py"):
        ours = {name.split(".")[0] for name in _imports(path)} & {"workers", "api_gateway", "aptix_cli"}
        assert not ours, path


def test_every_step_in_the_map_has_a_task_and_a_module() -> None:
    app = create_celery(Settings())
    for step, spec in STEP_MAP.items():
        assert task_name(step) in app.tasks
        assert (ROOT / "workers" / "steps" / f"{step.value}.py").exists()
        assert spec.run.__module__ == f"workers.steps.{step.value}"


def test_only_app_and_tasks_import_celery_in_workers() -> None:
    for path in (ROOT / "workers").rglob("*.py"):
        if path.name in {"app.py", "tasks.py"}:
            continue
        assert "celery" not in {name.split(".")[0] for name in _imports(path)}, path


def test_error_codes_are_exactly_the_documented_set() -> None:
    assert {code.value for code in ErrorCode} == DOCUMENTED_ERROR_CODES
