"""Static checks the style guide asks for: mypy --strict on the packages, and ruff's pyflakes rules."""

from __future__ import annotations

import subprocess
import sys
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


def test_code_passes_ruff_pyflakes_rules() -> None:
    done = subprocess.run(
        [_tool("ruff"), "check", "--select", "F,E9", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
