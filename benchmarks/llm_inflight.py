"""How many LLM calls one worker process keeps in flight, and what each costs: pool x HTTP client.

Issue 9 item 3: the ``llm`` queue must keep >= 2,000 model calls in flight per worker process at
modest CPU. This benchmark measures the candidates before one is chosen. Run from the repo root::

    .venv/bin/python benchmarks/llm_inflight.py                      # all variants, 200 and 1000 ms
    .venv/bin/python benchmarks/llm_inflight.py --latency-ms 1000 --variants gevent+urllib3,gevent+client
    .venv/bin/python benchmarks/llm_inflight.py --inflight 2000 --servers 2 --duration 15 --warmup 5

What it does:

- starts the scripted model (``python -m scripted_llm --port P --latency-ms L``, uvicorn) as
  ``--servers`` separate processes on free ports; callers are spread over them round-robin;
- per variant, starts a fresh child interpreter (gevent variants patch the standard library first,
  so patching is clean), which runs ``--inflight`` callers (greenlets or OS threads), each POSTing a
  small Responses API request (instructions, one user message, one function tool) in a loop and
  decoding the JSON answer;
- after ``--warmup`` seconds (connections are opened lazily) it measures for ``--duration`` seconds.

Printed per variant and latency:

- ``calls/s``: calls that completed in the window, per second;
- ``inflight``: mean calls in flight over the window (time spent inside the POST, summed, / window);
- ``p50``/``p99`` ms: call duration (the server's latency plus queueing in client and server);
- ``cli ms/call`` (``(sys)``: the system part), ``cli cores``: the child's user+system CPU
  (``getrusage``) per call and per second; ``sw/call``: its context switches per call;
- ``srv ms/call``, ``srv cores``: the same for the scripted servers (``/proc/PID/stat``), summed;
- ``busy``: the whole machine's CPU use (``/proc/stat``) in cores;
- ``rss MB``: the child's peak resident set; ``errors``: calls that raised or were not 200.

When ``busy`` is close to ``nproc``, client and server compete for the cores and ``calls/s`` is a
machine limit, not a client limit: compare ``cli ms/call``, which stays meaningful.

Variants (``--variants``, comma separated): ``gevent+urllib3`` (one ``urllib3.PoolManager``,
``maxsize`` = in-flight, ``block=True``), ``gevent+httpx`` (one ``httpx.Client``,
``max_connections`` = in-flight), ``gevent+httpx-sharded`` (``httpx.Client`` of 50 connections each,
caller i uses client i // 50), ``threads+urllib3``, ``threads+httpx-sharded``, ``threads+httpx``, and
``gevent+client`` / ``threads+client`` (the project's ``workers.llm.ResponsesClient``, one per server).

The process needs one file descriptor per connection: the benchmark raises its RLIMIT_NOFILE soft
limit to the hard limit (children inherit it) and says so. This prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VARIANTS = (
    "gevent+urllib3",
    "gevent+httpx",
    "gevent+httpx-sharded",
    "threads+urllib3",
    "threads+httpx-sharded",
)
ALL_VARIANTS = (*DEFAULT_VARIANTS, "threads+httpx", "gevent+client", "threads+client")
SHARD_CONNECTIONS = 50
API_KEY = "sk-bench-not-a-secret"

# The child starts here: gevent patches before anything else (threading, socket, ssl) is imported.
_CHILD_BOOT = """
import sys
if sys.argv[1].startswith("gevent+"):
    from gevent import monkey
    monkey.patch_all()
import runpy
runpy.run_path(sys.argv.pop(2), run_name="__llm_inflight_child__")
"""


def request_body(index: int) -> dict[str, Any]:
    """A small, realistic Responses API request: the scripted model echoes the user's text."""
    return {
        "model": "gpt-4.1-mini",
        "instructions": "You are a helpful assistant. Answer briefly and use the tools when needed.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"Hello, caller {index}: what is the time in Paris?"}],
            }
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_current_time",
                "description": "The current time in a time zone.",
                "parameters": {
                    "type": "object",
                    "properties": {"tz": {"type": "string"}},
                    "required": ["tz"],
                    "additionalProperties": False,
                },
                "strict": True,
            }
        ],
        "store": False,
    }


# --------------------------------------------------------------------------------------------- child


def _posters(variant: str, urls: list[str], inflight: int) -> tuple[list[Any], Any]:
    """One ``post(url, body) -> decoded answer`` per caller, and a function closing everything."""
    _, client = variant.split("+", 1)
    if client == "urllib3":
        import urllib3

        manager = urllib3.PoolManager(
            maxsize=inflight,
            block=True,
            retries=False,
            timeout=urllib3.Timeout(connect=30.0, read=120.0),
            headers={"Authorization": f"Bearer {API_KEY}"},
        )

        def post_urllib3(url: str, body: dict[str, Any]) -> Any:
            answer = manager.request("POST", url, json=body, redirect=False, pool_timeout=120.0)
            if answer.status != 200:
                raise RuntimeError(f"status {answer.status}")
            return json.loads(answer.data)

        return [post_urllib3] * inflight, manager.clear
    if client in ("httpx", "httpx-sharded"):
        import httpx

        size = inflight if client == "httpx" else SHARD_CONNECTIONS
        clients = [
            httpx.Client(
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=httpx.Timeout(120.0),
                limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
            )
            for _ in range(-(-inflight // size))
        ]

        def poster(http: httpx.Client) -> Any:
            def post_httpx(url: str, body: dict[str, Any]) -> Any:
                answer = http.post(url, json=body)
                if answer.status_code != 200:
                    raise RuntimeError(f"status {answer.status_code}")
                return answer.json()

            return post_httpx

        per_client = [poster(http) for http in clients]

        def close_all() -> None:
            for http in clients:
                http.close()

        return [per_client[i // size] for i in range(inflight)], close_all
    if client == "client":
        from workers.llm import ResponsesClient

        share = -(-inflight // len(urls))
        by_url = {
            url: ResponsesClient(base_url=url.removesuffix("/responses"), api_key=API_KEY, max_connections=share)
            for url in urls
        }

        def post_client(url: str, body: dict[str, Any]) -> Any:
            return by_url[url].create(body)

        def close_clients() -> None:
            for responses in by_url.values():
                responses.close()

        return [post_client] * inflight, close_clients
    raise SystemExit(f"unknown client in variant {variant!r}")


def _usage() -> tuple[float, float, int]:
    """User CPU seconds, system CPU seconds, and context switches (voluntary + involuntary) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw


def _child_main(argv: list[str]) -> int:
    import logging
    import threading

    logging.basicConfig(level=logging.ERROR)  # the client's per-failure warnings would flood the table

    variant, urls_text, inflight_text, warmup_text, duration_text = argv
    urls = urls_text.split(",")
    inflight, warmup, duration = int(inflight_text), float(warmup_text), float(duration_text)
    posters, close = _posters(variant, urls, inflight)
    bodies = [request_body(i) for i in range(inflight)]
    starts: list[float | None] = [None] * inflight
    spans: list[list[tuple[float, float]]] = [[] for _ in range(inflight)]
    errors = [0] * inflight
    error_kinds: dict[str, int] = {}
    stop = False
    now = time.monotonic

    def caller(index: int) -> None:
        url, post, body, mine = urls[index % len(urls)], posters[index], bodies[index], spans[index]
        while not stop:
            began = starts[index] = now()
            try:
                post(url, body)
            except Exception as exc:
                errors[index] += 1
                cause = exc.__cause__ or exc.__context__
                kind = type(exc).__name__ + (f"<-{type(cause).__name__}" if cause is not None else "")
                error_kinds[kind] = error_kinds.get(kind, 0) + 1
            ended = now()
            starts[index] = None
            mine.append((began, ended))

    for index in range(inflight):
        threading.Thread(target=caller, args=(index,), daemon=True).start()
    time.sleep(warmup)  # gevent-patched in gevent variants: the callers run meanwhile
    window_start, usage_start, errors_start = now(), _usage(), sum(errors)
    print("WINDOW_START", flush=True)
    time.sleep(duration)
    window_end, usage_end, errors_end = now(), _usage(), sum(errors)
    open_starts = list(starts)
    done = [list(mine) for mine in spans]
    stop = True
    print("WINDOW_END", flush=True)

    durations: list[float] = []
    busy = 0.0
    for mine in done:
        for began, ended in mine:
            if ended < window_start or ended > window_end:
                continue
            durations.append(ended - began)
            busy += ended - max(began, window_start)
    busy += sum(window_end - max(began, window_start) for began in open_starts if began is not None)
    window = window_end - window_start
    durations.sort()
    calls = len(durations)
    result = {
        "variant": variant,
        "calls": calls,
        "window_s": window,
        "calls_per_s": calls / window,
        "inflight_mean": busy / window,
        "p50_ms": 1000 * durations[calls // 2] if calls else None,
        "p99_ms": 1000 * durations[min(calls - 1, int(calls * 0.99))] if calls else None,
        "cpu_s": usage_end[0] + usage_end[1] - usage_start[0] - usage_start[1],
        "sys_s": usage_end[1] - usage_start[1],
        "switches": usage_end[2] - usage_start[2],
        "errors": errors_end - errors_start,
        "error_kinds": dict(error_kinds),
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print("RESULT " + json.dumps(result), flush=True)
    try:
        close()
    finally:
        os._exit(0)  # daemon callers may still be inside a call


# -------------------------------------------------------------------------------------------- parent


def _proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_seconds() -> float:
    """CPU seconds spent not idle on the whole machine, all cores."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _start_servers(count: int, latency_ms: float) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    import urllib.request

    servers, urls = [], []
    for _ in range(count):
        port = _free_port()
        command = [sys.executable, "-m", "scripted_llm", "--port", str(port), "--latency-ms", str(latency_ms)]
        servers.append(subprocess.Popen([*command, "--journal-size", "16"], cwd=ROOT))
        urls.append(f"http://127.0.0.1:{port}/v1/responses")
    deadline = time.monotonic() + 20
    for url in urls:
        health = url.replace("/v1/responses", "/__scripted/healthz")
        while True:
            try:
                with urllib.request.urlopen(health, timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"scripted server {url} did not start")
            time.sleep(0.1)
    return servers, urls


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _run_variant(
    variant: str, urls: list[str], servers: list[subprocess.Popen[bytes]], args: argparse.Namespace
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [
            sys.executable, "-c", _CHILD_BOOT, variant, __file__,
            ",".join(urls), str(args.inflight), str(args.warmup), str(args.duration),
        ],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    server_start = machine_start = 0.0
    server_cpu = machine_busy = 0.0
    result: dict[str, Any] = {"variant": variant, "failed": "no result"}
    for line in child.stdout:
        if line.startswith("WINDOW_START"):
            server_start = sum(_proc_cpu_seconds(s.pid) for s in servers)
            machine_start = _machine_busy_seconds()
        elif line.startswith("WINDOW_END"):
            server_cpu = sum(_proc_cpu_seconds(s.pid) for s in servers) - server_start
            machine_busy = _machine_busy_seconds() - machine_start
        elif line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
    child.wait(timeout=30)
    if "failed" in result:
        return result
    result["server_cpu_s"] = server_cpu
    result["machine_busy_s"] = machine_busy
    return result


def _print_header(latency_ms: float, args: argparse.Namespace) -> None:
    print(
        f"\n== latency {latency_ms:g} ms, {args.inflight} callers, {args.servers} server process(es), "
        f"window {args.duration:g} s after {args.warmup:g} s warm-up; "
        f"ideal {args.inflight / latency_ms * 1000:.0f} calls/s"
    )
    print(
        f"{'variant':24} {'calls/s':>8} {'inflight':>8} {'p50 ms':>7} {'p99 ms':>7} {'cli ms/call':>11} "
        f"{'(sys)':>6} {'cli cores':>9} {'sw/call':>7} {'srv ms/call':>11} {'srv cores':>9} "
        f"{'busy':>5} {'rss MB':>7} {'errors':>6}"
    )


def _print_row(row: dict[str, Any]) -> None:
    if "failed" in row:
        print(f"{row['variant']:24} FAILED: {row['failed']}")
        return
    calls, window = max(row["calls"], 1), row["window_s"]
    print(
        f"{row['variant']:24} {row['calls_per_s']:8.0f} {row['inflight_mean']:8.0f} {row['p50_ms'] or 0:7.0f} "
        f"{row['p99_ms'] or 0:7.0f} {1000 * row['cpu_s'] / calls:11.2f} "
        f"{1000 * row['sys_s'] / calls:6.2f} {row['cpu_s'] / window:9.2f} {row['switches'] / calls:7.1f} "
        f"{1000 * row['server_cpu_s'] / calls:11.2f} {row['server_cpu_s'] / window:9.2f} "
        f"{row['machine_busy_s'] / window:5.2f} {row['maxrss_mb']:7.0f} {row['errors']:6d}",
        flush=True,
    )
    if row.get("error_kinds"):
        print(f"{'':24} errors during the whole run, by kind: {row['error_kinds']}", flush=True)


def _raise_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(
        f"RLIMIT_NOFILE soft {soft} -> {max(soft, hard)} (hard {hard}); about {needed} descriptors needed per process"
    )
    if hard < needed:
        print(f"WARNING: the hard limit {hard} is below {needed}: expect 'Too many open files'")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one table per latency."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inflight", type=int, default=2000, help="callers per client process")
    parser.add_argument("--latency-ms", default="200,1000", help="comma-separated server latencies")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"of {', '.join(ALL_VARIANTS)}")
    parser.add_argument("--servers", type=int, default=1, help="scripted server processes (round-robin)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the window")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for variant in variants:
        if variant not in ALL_VARIANTS:
            parser.error(f"unknown variant {variant!r}")
    print(f"python {sys.version.split()[0]}, nproc {os.cpu_count()}")
    _raise_nofile(args.inflight + 100)
    for latency_ms in (float(v) for v in args.latency_ms.split(",")):
        _print_header(latency_ms, args)
        for variant in variants:
            # Fresh servers per variant: no connections or state left over from the previous run.
            servers, urls = _start_servers(args.servers, latency_ms)
            try:
                _print_row(_run_variant(variant, urls, servers, args))
            finally:
                _stop(servers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
elif __name__ == "__llm_inflight_child__":
    sys.exit(_child_main(sys.argv[1:]))
