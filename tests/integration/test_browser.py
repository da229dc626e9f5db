"""What an operator sees in a browser: Flower's task list with a turn's tasks, its Failed filter, and
the gateway's /docs page rendering the API offline. Headless Chromium (Debian's ``chromium``, driven by
Playwright); each test saves a screenshot under ``$APTIX_TEST_ARTIFACTS`` (default ``test-artifacts/``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from tests.integration.conftest import System
from tests.support.flower import Flower
from tests.support.waiting import wait_for
from tests.system_tools import EXECUTABLE, HOW_TO_INSTALL

pytestmark = pytest.mark.integration

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip
"""Headless Chromium as root in a container, with nothing of its own reaching out to the network."""


class Chromium:
    """Starts headless Chromium on first use; a missing browser fails the test that asked for it."""

    def __init__(self, playwright: Playwright) -> None:
        self._playwright = playwright
        self._browser: Browser | None = None

    def page(self, **context_options: Any) -> Page:
        """A page in a fresh browser context (no cookies or local storage from another test)."""
        if self._browser is None:
            executable = shutil.which(EXECUTABLE)
            if executable is None:
                pytest.fail(HOW_TO_INSTALL, pytrace=False)
            self._browser = self._playwright.chromium.launch(
                executable_path=executable, headless=True, args=CHROMIUM_ARGS
            )
        return self._browser.new_context(viewport={"width": 1400, "height": 900}, **context_options).new_page()

    def close(self) -> None:
        """Close the browser, if it was started."""
        if self._browser is not None:
            self._browser.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    """Headless Chromium for this module's tests."""
    with sync_playwright() as playwright:
        browser = Chromium(playwright)
        yield browser
        browser.close()


def test_flower_task_list_shows_every_task_of_a_turn_by_its_turn_id(
    system: System, flower: Flower, chromium: Chromium
) -> None:
    # Given a turn with one server tool call, whose 3 tasks (a task per call, the entry's making the first: the
    # default) Flower has seen end
    key = uuid.uuid4().hex
    turn = system.run_turn({"input": f"[[call:record_call {json.dumps({'key': key})}]] {key}"})
    assert turn["status"] == "completed"
    turn_id = turn["turn_id"]
    wait_for(lambda: len(flower.tasks(search=turn_id, state="SUCCESS")) >= 3, what="Flower to see the turn's tasks")
    # When an operator opens Flower's task list and searches for the turn id
    page = chromium.page(http_credentials={"username": flower.user, "password": flower.password})
    try:
        page.goto(f"{flower.url}/tasks")
        page.locator("#tasks-table_filter input").fill(turn_id)
        # Then the page lists the turn's 3 tasks, the turn id visible in each row's args column, and in each
        # row's result the steps that task ran (the reasoner and the persistence inline after the last call)
        rows = page.locator("#tasks-table tbody tr", has_text=turn_id)
        expect(rows).to_have_count(3)
        expect(page.locator(".dataTables_scrollHead th", has_text="Args")).to_be_visible()
        expect(page.locator(".dataTables_scrollHead th", has_text="Result")).to_be_visible()
        expect(rows.filter(has_text="aptix.step.execute_server_tools")).to_have_count(1)
        expect(rows.filter(has_text="SUCCESS")).to_have_count(3)
        expect(rows.filter(has_text=re.compile(r"compose [\d.]+ ms, llm_call [\d.]+ ms"))).to_have_count(1)
        expect(rows.filter(has_text=re.compile(r"reasoner [\d.]+ ms, persist [\d.]+ ms"))).to_have_count(1)
    finally:
        _screenshot(page, "flower-tasks-of-a-turn")


def test_flower_failed_filter_on_the_task_list_shows_the_task_that_failed_a_turn(
    system: System, flower: Flower, chromium: Chromium
) -> None:
    # Given a turn that failed because its server tool raised
    marker = f"m{uuid.uuid4().hex[:10]}"
    turn = system.run_turn({"input": f"[[call:explode {json.dumps({'reason': marker})}]] {marker}"})
    assert turn["status"] == "failed"
    wait_for(lambda: flower.tasks(search=turn["turn_id"], state="FAILURE"), what="Flower to see the failed task")
    # When an operator opens the task list and presses its Failed filter
    page = chromium.page(http_credentials={"username": flower.user, "password": flower.password})
    try:
        page.goto(f"{flower.url}/tasks")
        page.locator("button.task-state-filter[data-task-state=FAILURE]").click()
        # Then the newest failed task is the turn's execute_server_tools, marked FAILURE, with the turn id
        row = page.locator("#tasks-table tbody tr", has_text=turn["turn_id"])
        expect(row).to_have_count(1)
        expect(row).to_contain_text("aptix.step.execute_server_tools")
        expect(row.locator(".badge")).to_have_text("FAILURE")
    finally:
        _screenshot(page, "flower-failed-filter")


def test_flower_task_list_is_refused_without_the_password(flower: Flower, chromium: Chromium) -> None:
    page = chromium.page()
    statuses: list[int] = []
    page.on("response", lambda response: statuses.append(response.status))
    try:
        # Headless Chromium cannot ask for credentials: the 401 ends the navigation
        with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
            page.goto(f"{flower.url}/tasks")
        assert statuses == [401]
    finally:
        _screenshot(page, "flower-without-password")


def test_gateway_docs_page_renders_every_operation_from_the_gateway_alone(system: System, chromium: Chromium) -> None:
    operations = sum(len(methods) for methods in system.http.get("/openapi.json").json()["paths"].values())
    page = chromium.page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    try:
        response = page.goto(f"{system.gateway_url}/docs")
        # The page comes with the gateway's protective headers, which do not stop it rendering
        assert response is not None and response.status == 200
        assert response.headers["x-content-type-options"] == "nosniff" and response.headers["x-frame-options"] == "DENY"
        # Every operation of the API is rendered, with its method and path
        expect(page.locator(".opblock")).to_have_count(operations)
        expect(page.locator(".opblock-summary-path", has_text="/v1/turns/{turn_id}/tool-results")).to_have_count(1)
        posts = page.locator(".opblock-post .opblock-summary-path")
        expect(posts.filter(has_text="/v1/batches")).to_have_count(2)  # create and cancel
        expect(posts.filter(has_text="/v1/batches/{batch_id}/cancel")).to_have_count(1)
        expect(page.locator("h2.title")).to_contain_text("Aptix agent workers")
        # And nothing was loaded from anywhere but the gateway (it works offline)
        assert requested and all(url.startswith(f"{system.gateway_url}/") for url in requested), requested
    finally:
        _screenshot(page, "gateway-docs")


def _screenshot(page: Page, name: str) -> None:
    """Save the page as ``<artifacts>/<name>.png`` and close its context."""
    page.screenshot(path=str(_artifacts() / f"{name}.png"), full_page=True)
    page.context.close()


def _artifacts() -> Path:
    folder = Path(os.environ.get("APTIX_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
