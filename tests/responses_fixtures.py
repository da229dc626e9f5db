"""Access to the shared Responses API fixtures and their validate.py, for tests.

The fixtures live outside the repository (their provenance notes ask not to copy them in).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["fixtures_dir", "load_fixture", "validate_request_bodies", "validate_response_bodies"]

_ENV = "APTIX_FIXTURES_DIR"
_REPO = Path(__file__).resolve().parents[1]


def fixtures_dir() -> Path:
    """The fixtures directory: ``$APTIX_FIXTURES_DIR``, ``<repo>/../shared/...``, or ``/work/shared/...``.

    Returns:
        A directory holding ``validate.py``.

    Raises:
        RuntimeError: none of the candidates exists (a failure, never a skip).
    """
    candidates: list[Path] = []
    if os.environ.get(_ENV):
        candidates.append(Path(os.environ[_ENV]))
    candidates += [_REPO.parent / "shared" / "fixtures" / "responses_api", Path("/work/shared/fixtures/responses_api")]
    for candidate in candidates:
        if (candidate / "validate.py").is_file():
            return candidate
    looked = ", ".join(str(path) for path in candidates)
    raise RuntimeError(f"Responses API fixtures not found (looked in: {looked}); set {_ENV} to their directory")


def load_fixture(name: str) -> Any:
    """The decoded JSON of one fixture file, e.g. ``"spec_functions_response.json"``."""
    return json.loads((fixtures_dir() / name).read_text(encoding="utf-8"))


def validate_request_bodies(bodies: list[dict[str, Any]]) -> None:
    """Check request bodies with validate.py (``--kind request``).

    Raises:
        AssertionError: validate.py rejected one, with its output.
    """
    _validate(bodies, ["--kind", "request"])


def validate_response_bodies(bodies: list[dict[str, Any]]) -> None:
    """Check response bodies with validate.py (``--kind response --lenient``).

    Raises:
        AssertionError: validate.py rejected one, with its output.
    """
    _validate(bodies, ["--kind", "response", "--lenient"])


def _validate(bodies: list[dict[str, Any]], options: list[str]) -> None:
    assert bodies, "nothing to validate"
    with tempfile.TemporaryDirectory(prefix="aptix-validate-") as tmp:
        files = []
        for index, body in enumerate(bodies):
            path = Path(tmp) / f"body_{index:03d}.json"
            path.write_text(json.dumps(body), encoding="utf-8")
            files.append(str(path))
        result = subprocess.run(
            [sys.executable, str(fixtures_dir() / "validate.py"), *options, "-q", *files],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            dumped = "\n".join(f"{path}: {json.dumps(body)[:2000]}" for path, body in zip(files, bodies, strict=True))
            raise AssertionError(
                f"validate.py {' '.join(options)} exited {result.returncode}:\n"
                f"{result.stdout}{result.stderr}\nbodies:\n{dumped}"
            )
