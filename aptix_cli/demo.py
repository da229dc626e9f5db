"""``aptix demo``: one scripted conversation through the real gateway and a real worker.

Runs against the local Redis and PostgreSQL (``APTIX_DATABASE_URL`` / ``APTIX_REDIS_URL`` win when
set), with the bundled scripted model, and prints what happened.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx
import psycopg

from aptix_cli.stack import LocalStack
from scripted_llm import ScriptedServer

__all__ = ["run_demo"]

_DEMO_KEY = "demo-key"
_DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/aptix_demo"
_DEFAULT_REDIS = "redis://127.0.0.1:6379"


def run_demo() -> int:
    """Run the demo; 0 when every turn completed."""
    from shared.db.migrate import upgrade

    database_url = os.environ.get("APTIX_DATABASE_URL") or _create_database(_DEFAULT_DATABASE_URL)
    redis_url = os.environ.get("APTIX_REDIS_URL") or f"{_DEFAULT_REDIS}/5"
    broker_url = os.environ.get("APTIX_BROKER_URL") or (redis_url if "APTIX_REDIS_URL" in os.environ else f"{_DEFAULT_REDIS}/6")
    upgrade(database_url)
    _say("database ready: %s" % database_url.rsplit("@", 1)[-1])
    with ScriptedServer() as llm:
        env = {
            "APTIX_DATABASE_URL": database_url,
            "APTIX_REDIS_URL": redis_url,
            "APTIX_BROKER_URL": broker_url,
            "APTIX_LLM_BASE_URL": os.environ.get("APTIX_LLM_BASE_URL") or llm.base_url,
            "APTIX_API_KEYS": f"{_DEMO_KEY}:demo-org:demo-user",
        }
        stack = LocalStack(env)
        try:
            stack.start_worker("demo-worker")
            _, url = stack.start_gateway()
            _say(f"gateway on {url}, one worker, scripted model on {llm.base_url}")
            return _tour(url)
        finally:
            stack.stop_all()


def _tour(url: str) -> int:
    headers = {"Authorization": f"Bearer {_DEMO_KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        first = _turn(http, {"input": "Hello! What can you do?", "mode": "general"})
        second = _turn(http, {"session_id": first["session_id"], "input": "Tell me more, please."})
        session = http.get(f"/v1/sessions/{first['session_id']}").json()
        _say(f"session {session['session_id']}: mode {session['mode']}, {len(session['turns'])} turns")
    ok = first["status"] == second["status"] == "completed"
    _say("demo finished: " + ("every turn completed" if ok else "a turn did not complete"))
    return 0 if ok else 1


def _turn(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/turns", json=body, params={"wait": 30})
    response.raise_for_status()
    turn: dict[str, Any] = response.json()
    _say(f"> {body['input']}")
    _say(f"< [{turn['status']}, mode {turn['mode']}] {turn['output_text']}")
    if turn.get("error"):
        _say("  error: " + json.dumps(turn["error"]))
    return turn


def _create_database(url: str) -> str:
    admin, _, name = url.rpartition("/")
    with psycopg.connect(f"{admin}/postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    return url


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
