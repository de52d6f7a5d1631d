"""The run report in a real Chromium: downloaded with the run page's Report button, then opened
from the disk with the network cut (every request that is not for a file is aborted): every
figure renders from the plotly.js inside the file. Screenshot in tests/artifacts/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser as Chromium
from playwright.sync_api import Route

from tests.browser.conftest import ARTIFACTS, CHROMIUM_ARGS, VIEWPORT, Server, Visit
from tests.browser.test_dashboard import agent_client
from tests.browser.test_faults import fault, starting_run, trained
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

FIGURES = ("plans", "gantt", "idle", "throughput", "training", "faults")
assert CHROMIUM_ARGS  # the offline tab runs in the session's Chromium, started with these


@pytest.fixture(scope="module")
def report_lab(server: Server) -> tuple[int, list[dict[str, Any]]]:
    """Three generated devices (their own model spec), enrolled and profiled as their agents
    would through the agent API."""
    spec, devices = generated_testbed(seed=29, layers=10, devices=3)  # a model of its own
    return enrol(server.api(), spec, devices)


def report_a_run(server: Server, run: int, rows: list[str],
                 devices: list[dict[str, Any]]) -> None:
    """The agents' reports: three stages training, a lost device and its recovery, throughput,
    loss and accuracy."""
    keys = {d["uid"]: d["authorization"] for d in devices}
    agent = agent_client(server)
    for k, uid in enumerate(rows):
        body: dict[str, Any] = {"timeline": trained(run, uid, k, [0.5 * m + 0.2 * k
                                                                  for m in range(8)])}
        if k == 0:
            body["metrics"] = [m for t in (1.0, 2.0, 3.0, 4.0) for m in (
                {"at": t, "kind": "throughput_sps", "value": 30.0 + t},
                {"at": t, "kind": "loss", "value": 2.3 - 0.3 * t},
                {"at": t, "kind": "accuracy", "value": 0.1 + 0.1 * t})]
            body["faults"] = [fault(run, 0.0, "run_started"),
                              fault(run, 2.0, "device_lost", rows[2], reason="test"),
                              fault(run, 2.2, "recovery_started"),
                              fault(run, 3.1, "recovered", resumed_at=4)]
        answer = agent.post(f"/api/agent/runs/{run}/events/", json=body,
                            headers={"Authorization": keys[uid]})
        assert answer.status_code == 201, answer.text


def test_the_downloaded_report_renders_every_figure_offline(
        visit: Visit, server: Server, report_lab, chromium: Chromium, tmp_path: Path):
    spec, devices = report_lab
    run, rows = starting_run(server, spec, devices, "reported")
    report_a_run(server, run, rows, devices)
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    with visit.page.expect_download() as download:
        visit.page.click("#export-report")
    assert download.value.suggested_filename == f"edgepipe-run-{run}-report.html"
    report = tmp_path / "report.html"
    download.value.save_as(report)

    offline = chromium.new_context(viewport=VIEWPORT, offline=True)
    requests: list[str] = []
    errors: list[str] = []

    def only_files(route: Route) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            route.abort()

    offline.route("**/*", only_files)
    page = offline.new_page()
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(report.as_uri())
        for name in FIGURES:
            page.wait_for_selector(f"#report-{name} .plotly .main-svg", timeout=30_000)
        assert page.locator(".plotly .main-svg").count() >= len(FIGURES)
        gantt = page.evaluate(
            "() => document.getElementById('report-gantt').data"
            ".map(t => [t.meta.role, t.meta.device, t.x.length])")
        assert [(role, device) for role, device, _ in gantt if role == "measured"] == [
            ("measured", uid) for uid in rows]
        assert all(n == 16 for role, _, n in gantt if role == "measured")
        assert any(role == "planned" for role, _, _ in gantt)  # the plan beneath
        # one bar per device in each of the five idle causes, drawn
        assert page.evaluate("document.getElementById('report-idle').data"
                             ".map(t => t.y.length)") == [3] * 5
        assert page.locator("#report-idle .barlayer .point").count() >= 3
        assert page.locator("#report-gantt .barlayer .point").count() >= 48
        assert "device lost" in page.inner_text("#faults")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "run-report.png"), full_page=True)
    finally:
        offline.close()
    assert [u for u in requests if not u.startswith(("file://", "data:", "blob:"))] == []
    assert errors == []
