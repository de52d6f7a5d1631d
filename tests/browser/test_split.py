"""Split learning in a real Chromium against a real server: create a study of a shared instance
through the form (a refused value first), let the server's Celery worker solve it with two
methods, and see the comparison and a Gantt of each schedule. Screenshots in tests/artifacts/."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import Server, Visit

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

MNIST = "data/sl/resnet101_mnist.jsonl"
WORKER_WITHIN_MS = 60_000


def test_create_a_split_study_and_see_the_methods_compared(visit: Visit, server: Server):
    page = visit.page
    visit.login(server.password)
    page.click("a.nav-link:has-text('Split learning')")
    page.wait_for_url(re.compile(r"/split/$"))
    page.fill("#id_name", "mnist, five clients")
    page.select_option("#id_shared", f"{MNIST}#0")  # 5 clients, 2 helpers
    for method in ("exact", "admm", "balanced-greedy", "random-fcfs", "auto"):
        page.set_checked(f"#method-{method}", method in ("balanced-greedy", "random-fcfs"))
    page.fill("#id_time_limit_s", "0")
    page.click("text=Create and solve")
    # refused: the reason next to the field, the rest of the form as it was
    error = page.locator('.field.has-error [data-for="time_limit_s"]')
    assert error.inner_text() == "must be more than 0 and at most 120 seconds"
    assert page.locator(".field.has-error").count() == 1
    assert page.input_value("#id_name") == "mnist, five clients"
    assert page.input_value("#id_shared") == f"{MNIST}#0"
    assert page.is_checked("#method-random-fcfs") and not page.is_checked("#method-auto")
    visit.screenshot("split-form-error")
    page.fill("#id_time_limit_s", "5")
    page.click("text=Create and solve")
    page.wait_for_url(re.compile(r"/split/\d+/$"))
    study = int(page.url.rstrip("/").rsplit("/", 1)[1])
    # the worker solves it; the page polls the detail API until both methods are done
    page.wait_for_selector("#study-status.badge-done", timeout=WORKER_WITHIN_MS)
    page.wait_for_selector("#split-why:not([hidden])")
    compare = server.api().get(f"/api/split/studies/{study}/compare/")
    assert [r["status"] for r in compare["rows"]] == ["done", "done"]
    assert page.inner_text("#split-why") == compare["reason"]
    assert "has the shortest makespan" in compare["reason"]
    assert page.locator("#split-table tr[data-schedule]").count() == 2
    best = page.locator("#split-table tr.is-best")
    assert best.count() == 1
    assert best.get_attribute("data-schedule") == str(compare["best"])
    assert f"{compare['rows'][0]['makespan']} slots" in best.inner_text()
    # a Gantt per schedule, best first: a row per helper, then one per client; every bar drawn
    page.wait_for_function("document.querySelectorAll('#split-gantts .split-gantt .main-svg')"
                           ".length >= 2", timeout=WORKER_WITHIN_MS)
    boxes = page.locator("#split-gantts .split-gantt")
    assert [boxes.nth(k).get_attribute("data-schedule") for k in range(2)] == [
        str(r["schedule"]) for r in compare["rows"]]
    for k in range(2):  # every helper has its row, even one that serves nobody
        labels = boxes.nth(k).locator(".ytick text").evaluate_all(
            "els => els.map(e => [e.getBoundingClientRect().top, e.textContent])"
            ".sort((a, b) => a[0] - b[0]).map(p => p[1])")  # top to bottom
        assert labels[:2] == ["helper 0", "helper 1"] and len(labels) == 2 + 5
        assert all(re.fullmatch(r"client \d \(h[01]\)", label) for label in labels[2:])
    first = boxes.first
    gantt = server.api().get(f"/api/split/studies/{study}/schedules/{compare['best']}/gantt/")
    assert first.locator(".point").count() == len(gantt["bars"])
    splits = page.evaluate("EdgePipe.splitPage")
    if splits["initiallyUnfinished"]:
        assert splits["polls"] >= 1 and splits["renders"] >= 2
    visit.screenshot("split")
    # the study in the list, done, with its best makespan
    visit.go("/split/")
    row = page.locator(f'tr[data-study="{study}"]')
    assert "done" in row.inner_text()
    assert f"{compare['rows'][0]['makespan']} slots" in row.inner_text()
