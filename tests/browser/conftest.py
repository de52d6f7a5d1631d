"""A real Chromium (Debian's package, driven by Playwright) against a real server: ``manage.py
serve`` (daphne and a Celery worker on the embedded topology: SQLite, the filesystem broker and
the in-memory channel layer) on a throwaway var/ directory. Screenshots go to tests/artifacts/.

Every page a test opens records the requests it makes; a test fails if any left the server."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser as Chromium
from playwright.sync_api import Page, sync_playwright

from tests.conftest import ROOT
from tests.webapp.integration.stack import (
    PYTHON,
    Browser,
    Processes,
    child_env,
    demo_admin_password,
    free_port,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "tests" / "artifacts"
VIEWPORT = {"width": 1440, "height": 900}
# the console line of an API call the server refused on purpose (a 4xx the page then explains)
REFUSED = re.compile(r"Failed to load resource: the server responded with a status of 4\d\d")


@dataclass
class Server:
    base: str
    env: dict[str, str]
    password: str
    processes: Processes
    var: Path

    def api(self) -> Browser:
        """The admin's session over HTTP, for setting up what a test does not do in the page."""
        return Browser(self.base, "admin", self.password)

    def manage_shell(self, code: str) -> str:
        import subprocess

        done = subprocess.run([PYTHON, "manage.py", "shell", "-c", code], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    var = tmp_path_factory.mktemp("browser-var")
    logs = tmp_path_factory.mktemp("browser-logs")
    # every batch of events gets its idle delta (by default at most one every 2 s), so that the
    # page's state after the last batch can be compared with a fresh snapshot
    # and a learned planner (TAPP) trains for a few seconds, not a minute
    env = child_env(DJANGO_SETTINGS_MODULE="webapp.settings.local", EDGEPIPE_VAR_DIR=str(var),
                    DEBUG="false", LIVE_IDLE_INTERVAL_S="0", PLANNING_LEARNED_EPISODES="60")
    port = free_port()
    processes = Processes(logs, env)
    try:
        processes.serve(port)
        yield Server(f"http://127.0.0.1:{port}", env, demo_admin_password(env), processes, var)
    finally:
        processes.stop_all()
        for log in sorted(logs.glob("*.log")):
            print(f"----- {log.name}\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    """One Chromium per test module. Between its calls Playwright's sync API keeps its event
    loop marked as the thread's running loop, and Django then refuses every database call from
    the thread (SynchronousOnlyOperation). In one process pytest-django runs the database tests
    first; under pytest-xdist a worker runs the modules it is given in turn, so a browser
    module closes Playwright before the worker's next module."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@dataclass
class Visit:
    """A browser tab on the server, with every request it made."""

    page: Page
    base: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def go(self, path: str) -> None:
        self.page.goto(self.base + path)

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def login(self, password: str) -> None:
        self.go("/login/")
        self.page.fill("#id_username", "admin")
        self.page.fill("#id_password", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_url(re.compile(r".*/$"))


@pytest.fixture
def visit(chromium: Chromium, server: Server) -> Iterator[Visit]:
    context = chromium.new_context(viewport=VIEWPORT, accept_downloads=True)
    page = context.new_page()
    tab = Visit(page, server.base)
    page.on("request", lambda request: tab.requests.append(request.url))
    page.on("pageerror", lambda error: tab.errors.append(str(error)))
    page.on("console", lambda m: tab.errors.append(m.text)
            if m.type == "error" and not REFUSED.search(m.text) else None)
    page.on("dialog", lambda dialog: dialog.accept())
    yield tab
    context.close()
    outside = [u for u in tab.requests
               if not u.startswith((server.base + "/", "data:", "blob:"))]
    assert outside == [], f"the pages fetched from outside the server: {outside}"
    assert tab.errors == [], f"the pages logged errors: {tab.errors}"
