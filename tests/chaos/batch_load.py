"""The load of the OpenAI batch fault: batches created with the official ``openai`` SDK, and their files checked.

Each batch is one JSON Lines file of chaos turns (``load.turn_input``: a ``count_run`` call, then an
answer), one line per key with the key as its ``custom_id``, uploaded through ``/openai/v1/files``
and run through ``/openai/v1/batches`` (an ``Idempotency-Key`` each, so the SDK's retries create it
once). A key is accepted when its batch's create answered. Once every batch ended,
:meth:`BatchLoad.check_files` downloads its output and error files: every key of the batch must be
in exactly one of them, once, and a line of the output file must be a completed response.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import openai

from tests.chaos.load import Ledger, turn_input
from tests.chaos.system import API_KEY, MODEL

__all__ = ["BatchLoad"]

logger = logging.getLogger(__name__)

_MAX_RETRIES = 8
_ENDED = ("completed", "failed", "expired", "cancelled")


class BatchLoad:
    """Creates OpenAI batches of chaos turns and checks their output and error files."""

    def __init__(self, gateway_url: str, *, ledger: Ledger, tag: str) -> None:
        self._ledger = ledger
        self._tag = tag
        self._client = openai.OpenAI(
            base_url=f"{gateway_url}/openai/v1", api_key=API_KEY, max_retries=_MAX_RETRIES, timeout=60.0
        )
        self._lock = threading.Lock()
        self.batches: dict[str, list[str]] = {}
        """Each batch created: its id and its keys."""

    def create(self, keys: Sequence[str], *, batches: int, spread: float) -> None:
        """Create ``batches`` batches of ``keys``, evenly over ``spread`` seconds."""
        size = -(-len(keys) // max(batches, 1))
        chunks = [list(keys[start : start + size]) for start in range(0, len(keys), size)]
        began = time.monotonic()
        for index, chunk in enumerate(chunks):
            time.sleep(max(0.0, began + spread * index / max(len(chunks), 1) - time.monotonic()))
            self._create(chunk, name=f"{self._tag}-{index}")

    def check_files(self, *, timeout: float) -> tuple[list[str], list[str]]:
        """Wait up to ``timeout`` seconds for every batch to end, then read its files.

        Returns:
            What broke the promise (a key in neither file, in both, twice, a batch not ended or not
            ``completed``, an output line that is not a completed response), and notes (one per batch).
        """
        deadline = time.monotonic() + timeout
        problems: list[str] = []
        notes: list[str] = []
        for batch_id, keys in self.batches.items():
            batch = self._ended(batch_id, deadline=deadline)
            if batch is None:
                problems.append(f"batch {batch_id} did not end within {timeout:.0f} s")
                continue
            if batch.status != "completed":
                problems.append(f"batch {batch_id} ended {batch.status}")
            output = self._lines(batch.output_file_id)
            errors = self._lines(batch.error_file_id)
            found = Counter(str(line.get("custom_id")) for line in output + errors)
            missing = sorted(set(keys) - set(found))
            twice = sorted(key for key, count in found.items() if count > 1)
            strangers = sorted(set(found) - set(keys))
            incomplete = [line.get("custom_id") for line in output if not _completed(line)]
            for count, what in ((missing, "in neither file"), (twice, "more than once"), (strangers, "not its own"),
                                (incomplete, "in the output file without a completed response")):  # fmt: skip
                if count:
                    problems.append(f"batch {batch_id}: {len(count)} requests {what} (e.g. {count[:3]})")
            notes.append(
                f"batch {batch_id}: {len(keys)} requests, {len(output)} output lines, {len(errors)} error lines"
            )
        return problems, notes

    def close(self) -> None:
        """Close the SDK's connections."""
        self._client.close()

    def _create(self, keys: list[str], *, name: str) -> None:
        lines = [{"custom_id": key, "method": "POST", "url": "/v1/responses",
                  "body": {"model": MODEL, "input": turn_input(key)}} for key in keys]  # fmt: skip
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        try:
            upload = self._client.files.create(file=(f"{name}.jsonl", io.BytesIO(data)), purpose="batch")
            batch = self._client.batches.create(
                input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h",
                extra_headers={"Idempotency-Key": name},
            )  # fmt: skip
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            logger.warning("batch %s was not created: %s", name, exc)
            self._ledger.answer(getattr(exc, "status_code", None), keys, final=True)
            return
        with self._lock:
            self.batches[batch.id] = keys
        self._ledger.answer(200, keys, final=True)
        logger.info("openai batch %s of %d requests: %s", batch.id, len(keys), batch.status)

    def _ended(self, batch_id: str, *, deadline: float) -> Any:
        while True:
            try:
                batch = self._client.batches.retrieve(batch_id)
            except (openai.APIStatusError, openai.APIConnectionError):
                batch = None
            if batch is not None and batch.status in _ENDED:
                return batch
            if time.monotonic() >= deadline:
                return None
            time.sleep(1.0)

    def _lines(self, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        text = self._client.files.content(file_id).text
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _completed(line: dict[str, Any]) -> bool:
    response = line.get("response") or {}
    body = response.get("body") or {}
    return response.get("status_code") == 200 and body.get("status") == "completed" and line.get("error") is None
