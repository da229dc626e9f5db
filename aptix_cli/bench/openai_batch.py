"""``aptix bench --openai-batch``: a file of ``--turns`` requests through OpenAI's Files and Batch API, end to end.

On the production shape ``aptix bench`` starts (one gateway, ``--workers`` workers, the scripted
model, real Redis and PostgreSQL), as an OpenAI batch pipeline drives it, over plain HTTP:

1. write a JSON Lines file of ``--turns`` ``/v1/responses`` requests of about 2 KB each (50,000 make
   about 101 MB) and upload it (``POST /openai/v1/files``, multipart, streamed from disk);
2. create a batch on it (``POST /openai/v1/batches``: it answers ``validating``), poll it every
   0.2 s until it is ``in_progress`` (validated, every turn recorded), then until it ended;
3. download its output file (``GET /openai/v1/files/{id}/content``, streamed, counted, not kept).

Printed: the upload's time, the create's answer time, the time to validation done, to the first
completed request and to the batch's end, turns/s from ``in_progress`` to the last completion (from
the database's timestamps), the time from the last completion to the files written, the download's
time, and the gateway's resident memory: before, and its peak (``VmHWM``) after each phase.

With ``--two-orgs`` as well: organisations A and B each upload a file of ``--turns`` requests and
create a batch, B right after A; the same figures as ``--two-orgs`` prints for ``/v1/batches``
(:mod:`.two_orgs`): each organisation's throughput while both ran.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from aptix_cli.bench.cpu import memory_kib
from aptix_cli.bench.report import Report
from aptix_cli.bench.two_orgs import batch_figures, completed_between, overlap, report_both_ran

__all__ = ["run_openai_batch", "run_openai_two_orgs"]

_ENDED = ("completed", "failed", "expired", "cancelled")
_POLL_SECONDS = 0.2
_PAD = "x" * 1930
"""Makes a line about 2 KB, as the issue's 101 MB file of 50,000 lines."""


def run_openai_batch(url: str, key: str, *, turns: int, gateway_pid: int, dsn: str, report: Report) -> bool:
    """Run one file end to end and print the figures; whether every request completed."""
    with tempfile.TemporaryDirectory() as folder, _client(url, key) as client:
        path = _write_file(Path(folder) / "requests.jsonl", turns, tag="a")
        size = path.stat().st_size
        before = memory_kib(gateway_pid)
        started = time.perf_counter()
        file_id = _upload(client, path)
        upload_s = time.perf_counter() - started
        after_upload = memory_kib(gateway_pid)
    with _client(url, key) as client:
        started = time.perf_counter()
        batch = _post(client, "/openai/v1/batches", {"input_file_id": file_id, "endpoint": "/v1/responses",
                                                     "completion_window": "24h"})  # fmt: skip
        create_ms = (time.perf_counter() - started) * 1000
        created_status = batch["status"]
        batch = _until(client, batch["id"], lambda found: found["status"] != "validating")
        validated_s = time.perf_counter() - started
        after_validation = memory_kib(gateway_pid)
        batch = _until(client, batch["id"], lambda found: found["status"] in _ENDED, stall_seconds=300)
        ended_s = time.perf_counter() - started
        download_started = time.perf_counter()
        downloaded, lines = _download(client, batch.get("output_file_id"))
        download_s = time.perf_counter() - download_started
        after_download = memory_kib(gateway_pid)
    with psycopg.connect(dsn, autocommit=True) as db:
        row = db.execute(
            "SELECT b.created_at, b.in_progress_at, b.ended_at, b.finished_at, min(t.completed_at), "
            "max(t.completed_at), count(*) FILTER (WHERE t.status = 'completed'), "
            "(SELECT min(f.created_at) FROM openai_files f WHERE f.batch_id = b.batch_id) "
            "FROM openai_batches b JOIN turns t ON t.batch_id = b.batch_id WHERE b.batch_id = %s "
            "GROUP BY b.batch_id",
            (batch["id"],),
        ).fetchone()
    assert row is not None
    created_at, in_progress_at, ended_at, finished_at, first_done, last_done, completed, writing_started = row
    report.line()
    report.line(f"an OpenAI batch of {turns} requests: /openai/v1/files, /openai/v1/batches, files.content")
    report.field("upload", f"{size / 1e6:.0f} MB in {upload_s:.1f} s ({size / 1e6 / upload_s:.0f} MB/s)")
    report.field("create answered", f"{create_ms:.0f} ms, {created_status}")
    report.field("validation done", f"{validated_s:.1f} s after the create ({turns / validated_s:,.0f} lines/s)")
    report.field("first request completed", f"{(first_done - created_at).total_seconds():.1f} s after the create")
    run_s = (last_done - in_progress_at).total_seconds()
    report.field("turns/s", f"{completed / run_s:.1f} (in_progress to the last completion: {run_s:.1f} s)")
    report.field("files written", _files_written(ended_at, writing_started, finished_at))
    report.field("batch ended", f"{ended_s:.1f} s after the create, {batch['status']}, {batch['request_counts']}")
    report.field("download", f"{downloaded / 1e6:.0f} MB, {lines} lines in {download_s:.1f} s")
    report.field(
        "gateway memory",
        f"VmRSS before {before['VmRSS'] / 1024:.0f} MiB; peak (VmHWM) after the upload "
        f"{after_upload['VmHWM'] / 1024:.0f}, after validation {after_validation['VmHWM'] / 1024:.0f}, "
        f"after the download {after_download['VmHWM'] / 1024:.0f} MiB",
    )
    return batch["status"] == "completed" and completed == turns and lines == turns


def _files_written(ended_at: datetime, writing_started: datetime | None, finished_at: datetime) -> str:
    """When the files were written: after the last request ended (a gateway notes the end within a poll, 5 s
    by default), and how long their job took (from its start, the files' ``created_at``, to ``finished_at``)."""
    text = f"{(finished_at - ended_at).total_seconds():.1f} s after the last request ended"
    if writing_started is None:
        return text
    return f"{text} (the job writing them: {(finished_at - writing_started).total_seconds():.1f} s)"


def run_openai_two_orgs(url: str, key_a: str, key_b: str, *, turns: int, dsn: str, report: Report) -> bool:
    """Two organisations' OpenAI batches, B created right after A; print the figures; whether all completed."""
    with tempfile.TemporaryDirectory() as folder, _client(url, key_a) as a, _client(url, key_b) as b:
        files = {name: _upload(client, _write_file(Path(folder) / f"{name}.jsonl", turns, tag=name))
                 for name, client in (("a", a), ("b", b))}  # fmt: skip
        body = {"endpoint": "/v1/responses", "completion_window": "24h"}
        batch_a = _post(a, "/openai/v1/batches", {**body, "input_file_id": files["a"]})
        batch_b = _post(b, "/openai/v1/batches", {**body, "input_file_id": files["b"]})
        ended: dict[str, dict[str, Any]] = {}

        def follow(name: str, client: httpx.Client, batch_id: str) -> None:
            ended[name] = _until(client, batch_id, lambda found: found["status"] in _ENDED, stall_seconds=300)

        threads = [threading.Thread(target=follow, args=("a", a, batch_a["id"])),
                   threading.Thread(target=follow, args=("b", b, batch_b["id"]))]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    with psycopg.connect(dsn, autocommit=True) as db:
        fig_a, fig_b = batch_figures(db, batch_a["id"]), batch_figures(db, batch_b["id"])
        window = overlap(fig_a, fig_b)
        in_window = {
            name: completed_between(db, batch_id, *window) if window else 0
            for name, batch_id in (("a", batch_a["id"]), ("b", batch_b["id"]))
        }
    report.line()
    report.line(f"two organisations, an OpenAI batch of {turns} requests each, B created right after A")
    report_both_ran(report, window, in_window)
    for name, figures in (("A", fig_a), ("B", fig_b)):
        first = (
            "none" if figures.first_done is None else f"{(figures.first_done - figures.accepted).total_seconds():.1f} s"
        )
        report.field(f"org {name}", f"first request completed {first} after its turns were recorded")
    return all(found.get("status") == "completed" for found in ended.values()) and len(ended) == 2


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                        timeout=httpx.Timeout(1800, connect=10))  # fmt: skip


def _write_file(path: Path, turns: int, *, tag: str) -> Path:
    with path.open("w") as out:
        for index in range(turns):
            body = {"model": "scripted-model", "input": f"bench openai batch {tag} {index}: {_PAD}"}
            line = {"custom_id": f"{tag}-{index}", "method": "POST", "url": "/v1/responses", "body": body}
            out.write(json.dumps(line) + "\n")
    return path


def _upload(client: httpx.Client, path: Path) -> str:
    with path.open("rb") as data:
        response = client.post("/openai/v1/files", data={"purpose": "batch"},
                               files={"file": (path.name, data, "application/jsonl")})  # fmt: skip
    response.raise_for_status()
    return str(response.json()["id"])


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    response.raise_for_status()
    found: dict[str, Any] = response.json()
    return found


def _until(client: httpx.Client, batch_id: str, done: Any, *, stall_seconds: float = 600) -> dict[str, Any]:
    """Poll the batch until ``done(batch)``; give up when its counts did not move for ``stall_seconds``."""
    last: tuple[object, ...] = ()
    moved = time.monotonic()
    while True:
        response = client.get(f"/openai/v1/batches/{batch_id}")
        response.raise_for_status()
        batch: dict[str, Any] = response.json()
        if done(batch):
            return batch
        now = (batch["status"], json.dumps(batch["request_counts"]))
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall_seconds:
            raise RuntimeError(f"batch {batch_id} stalled: {batch['status']} {batch['request_counts']}")
        time.sleep(_POLL_SECONDS)


def _download(client: httpx.Client, file_id: str | None) -> tuple[int, int]:
    """The output file's bytes and lines, streamed and dropped."""
    if file_id is None:
        return 0, 0
    size = lines = 0
    with client.stream("GET", f"/openai/v1/files/{file_id}/content") as response:
        response.raise_for_status()
        for chunk in _chunks(response):
            size += len(chunk)
            lines += chunk.count(b"\n")
    return size, lines


def _chunks(response: httpx.Response) -> Iterator[bytes]:
    yield from response.iter_bytes(64 * 1024)
