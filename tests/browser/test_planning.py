"""A planning worker that stops mid-plan, seen on the run page in a real Chromium: beat's watch
finds the plan's heartbeat stale, queues the plan again, and the page says which worker
stopped on which attempt, then that the next attempt finished it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import Server, Visit
from tests.webapp.integration.stack import Browser, enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


def plans(user: Browser, run_id: int) -> dict[str, dict[str, Any]]:
    return {p["algorithm"]: p for p in user.get(f"/api/runs/{run_id}/plans/")}


def test_a_worker_stopped_mid_plan_is_shown_on_the_run_page(visit: Visit, server: Server):
    # Prepare: a planned run
    user = server.api()
    spec, devices = generated_testbed(seed=23, layers=8, devices=2)  # a model of its own
    spec_id, enrolled = enrol(user, spec, devices)
    run = user.post("/api/runs/", {"name": "interrupted", "model_spec": spec_id,
                                   "devices": [d["id"] for d in enrolled],
                                   "algorithms": ["uniform", "ftpipehd"]}, expect=201)
    user.post(f"/api/runs/{run['id']}/plan/", {}, expect=202)
    user.wait_run(run["id"], ("planned",), timeout=60)
    uniform = plans(user, run["id"])["uniform"]["id"]
    # Execute: the run plans again and the uniform plan's worker falls silent mid-plan (its
    # row as a SIGKILLed worker leaves it); beat's watch runs. (The page opens after: on the
    # embedded topology a page hears only of what its own web process does.)
    server.manage_shell(
        "from datetime import timedelta; from django.utils import timezone; "
        "from webapp.runs import services; from webapp.runs.models import Run, Plan; "
        f"services.run_transition(run=Run.objects.get(pk={run['id']}), target='planning'); "
        f"Plan.objects.filter(pk={uniform}).update(status='running', attempts=1, "
        "worker='celery@killed', heartbeat_at=timezone.now() - timedelta(seconds=90)); "
        "print(services.plans_watch(silent_s=30))")
    visit.login(server.password)
    visit.go(f"/runs/{run['id']}/")
    page = visit.page
    # Assert: the page names the worker and the attempt, and the real worker computes the
    # plan again: the run is planned, the note says the next attempt finished it
    note = page.locator(f"[data-interrupted='{uniform}']")
    note.wait_for(timeout=30_000)
    assert "Worker celery@killed stopped during attempt 1" in note.inner_text()
    assert "no sign of life for 30 s" in note.inner_text()
    page.wait_for_selector("#run-state.badge-planned", timeout=60_000)
    page.wait_for_function(
        "id => (document.querySelector(`[data-interrupted='${id}']`) || {}).textContent"
        "?.includes('Attempt 2 finished it')", arg=uniform, timeout=30_000)
    visit.screenshot("plan-worker-stopped")
    stored = plans(user, run["id"])["uniform"]
    assert stored["attempts"] == 2 and stored["status"] == "done"
    assert [i["worker"] for i in stored["interruptions"]] == ["celery@killed"]
