"""Static checks the style guide asks for: mypy --strict on the packages, and ruff over the whole tree
with the rule set pyproject.toml selects (pyflakes, pycodestyle, import order, bugbear, logging
format, no print, pyupgrade, comprehensions, simplifications, ruff's own)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["shared", "workers", "api_gateway", "aptix_cli", "scripted_llm"]


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is missing from the virtualenv: run `make test` (it installs the test extras)"
    return str(path)


def test_packages_pass_mypy_strict() -> None:
    done = subprocess.run([_tool("mypy"), *PACKAGES], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_code_passes_the_configured_ruff_rules() -> None:
    done = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_ruff_rule_set_includes_import_order_bugbear_logging_and_print() -> None:
    # Guards against the selection shrinking back to pyflakes only.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert {"F", "E", "W", "I", "B", "G", "T20"} <= set(config["select"])
