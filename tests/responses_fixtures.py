"""The real-traffic Responses API fixtures and their validate.py, for tests; and the check every
request and response body of the tests goes through.

The fixtures live outside the repository (their provenance notes ask not to copy them in): a test
finds them through ``APTIX_FIXTURES_DIR`` only, which ``make test`` sets to
``../shared/fixtures/responses_api`` when that directory exists beside the checkout. Without it the
fixture tests are skipped with that reason and the run's summary says they were not run; the
project's own conformance check (:mod:`tests.support.responses_conformance`, the ``openai``
package's types) runs on every body either way, and ``validate.py`` runs on them too when the
fixtures are there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.responses_conformance import request_problems, response_problems, stream_problems

__all__ = [
    "FIXTURES_ENV",
    "fixtures_dir",
    "load_fixture",
    "validate_request_bodies",
    "validate_response_bodies",
    "validate_stream_bodies",
]

FIXTURES_ENV = "APTIX_FIXTURES_DIR"
NOT_RUN = (
    f"real-traffic Responses API fixture check not run: {FIXTURES_ENV} is not set "
    "(make test sets it to ../shared/fixtures/responses_api when that directory exists)"
)


def configured_dir() -> Path | None:
    """``$APTIX_FIXTURES_DIR``, or None when it is not set.

    Raises:
        RuntimeError: it is set but holds no ``validate.py`` (a failure, not a skip).
    """
    value = os.environ.get(FIXTURES_ENV)
    if not value:
        return None
    path = Path(value)
    if not (path / "validate.py").is_file():
        raise RuntimeError(f"{FIXTURES_ENV}={value} holds no validate.py: point it at the fixtures directory")
    return path


def fixtures_dir() -> Path:
    """The fixtures directory; the calling test is skipped (with :data:`NOT_RUN`) when it is not configured."""
    path = configured_dir()
    if path is None:
        pytest.skip(NOT_RUN)
    return path


def load_fixture(name: str) -> Any:
    """The decoded JSON of one fixture file, e.g. ``"spec_functions_response.json"``."""
    return json.loads((fixtures_dir() / name).read_text(encoding="utf-8"))


def validate_request_bodies(bodies: list[dict[str, Any]]) -> None:
    """Check request bodies: the project's conformance check, then validate.py (``--kind request``)
    when the fixtures are configured.

    Raises:
        AssertionError: a body breaks the SDK's types or the protocol, with what and where.
    """
    _check(bodies, request_problems)
    _validate(bodies, ["--kind", "request"])


def validate_response_bodies(bodies: list[dict[str, Any]]) -> None:
    """Check response bodies: the SDK's ``Response`` model, then validate.py (``--kind response
    --lenient``) when the fixtures are configured.

    Raises:
        AssertionError: a body is not a valid Response, with what and where.
    """
    _check(bodies, response_problems)
    _validate(bodies, ["--kind", "response", "--lenient"])


def validate_stream_bodies(bodies: list[bytes]) -> None:
    """Check event-stream bodies: the SDK's ``ResponseStreamEvent`` and the stream protocol, then
    validate.py (``--kind stream``) on each when the fixtures are configured.

    Raises:
        AssertionError: a stream breaks the SDK's types or the protocol, with what and where.
    """
    assert bodies, "nothing to validate"
    found = {index: problems for index, body in enumerate(bodies) if (problems := stream_problems(body))}
    assert not found, "\n".join(
        f"stream {index}: {'; '.join(problems)}\n  {bodies[index].decode()[:2000]}" for index, problems in found.items()
    )
    _validate_files([(f"stream_{index:03d}.sse", body) for index, body in enumerate(bodies)], ["--kind", "stream"])


def _check(bodies: list[dict[str, Any]], problems_of: Any) -> None:
    assert bodies, "nothing to validate"
    found = {index: problems for index, body in enumerate(bodies) if (problems := problems_of(body))}
    assert not found, "\n".join(
        f"body {index}: {'; '.join(problems)}\n  {json.dumps(bodies[index])[:2000]}"
        for index, problems in found.items()
    )


def _validate(bodies: list[dict[str, Any]], options: list[str]) -> None:
    _validate_files(
        [(f"body_{index:03d}.json", json.dumps(body).encode()) for index, body in enumerate(bodies)], options
    )


def _validate_files(named: list[tuple[str, bytes]], options: list[str]) -> None:
    """Run validate.py with ``options`` on each (file name, content), when the fixtures are configured."""
    directory = configured_dir()
    if directory is None:
        return
    with tempfile.TemporaryDirectory(prefix="aptix-validate-") as tmp:
        files = []
        for name, content in named:
            path = Path(tmp) / name
            path.write_bytes(content)
            files.append(str(path))
        result = subprocess.run(
            [sys.executable, str(directory / "validate.py"), *options, "-q", *files],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            dumped = "\n".join(
                f"{path}: {content.decode()[:2000]}" for path, (_, content) in zip(files, named, strict=True)
            )
            raise AssertionError(
                f"validate.py {' '.join(options)} exited {result.returncode}:\n"
                f"{result.stdout}{result.stderr}\nbodies:\n{dumped}"
            )
