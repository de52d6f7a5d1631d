"""Split learning trained on devices, from the browser: three enrolled devices that profiled a
model, two chosen as clients and one as a helper on /split/train/ (cuts refused first, the
error next to them and the rest of the form as typed), then the split run on its page while the
server's Celery worker plans it with each method. Screenshots in tests/artifacts/."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import Server, Visit
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

METHODS = ("balanced-greedy", "random-fcfs", "auto")  # the page's defaults
PLANNED_WITHIN_MS = 60_000


def test_train_split_learning_on_three_devices_from_the_form(visit: Visit, server: Server):
    # Prepare: three devices enrolled, each with its profile of an 8-layer model
    user = server.api()
    spec, devices = generated_testbed(seed=31, layers=18, devices=3)
    spec_id, enrolled = enrol(user, spec, devices)
    ids = [d["id"] for d in enrolled]
    page = visit.page
    visit.login(server.password)
    # Execute: from the split-learning page to the form, two clients and a helper
    visit.go("/split/")
    page.click("text=Train on devices")
    page.wait_for_url(re.compile(r"/split/train/$"))
    page.fill("#id_name", "split on three devices")
    page.select_option("#id_model_spec", str(spec_id))
    for device, role in zip(ids, ("Client", "Client", "Helper"), strict=True):
        row = page.locator(f'[data-device="{device}"]')
        assert re.search(r"\d\.\d\d× · 16 GiB · ", row.inner_text())
        row.locator(f"label:has-text('{role}')").click()
    assert [m for m in ("exact", "admm", *METHODS) if page.is_checked(f"#method-{m}")] == \
        list(METHODS)
    page.fill("#id_sigma1", "2")
    page.fill("#id_sigma2", "17")  # layers 0..17: nothing left for part-3
    page.fill("#id_epochs", "2")
    page.fill("#id_batches", "5")
    page.fill("#id_time_limit_s", "2")
    page.click("text=Create and plan")
    # refused: the reason next to the cut, the rest of the form as it was
    error = page.locator('.field.has-error [data-for="sigma2"]')
    assert error.inner_text() == ("must be at most 16 so that part-3 (layers sigma2+1..17) "
                                  "is not empty, got 17")
    assert page.locator(".field.has-error").count() == 1
    assert page.input_value("#id_name") == "split on three devices"
    assert page.input_value("#id_model_spec") == str(spec_id)
    for device, role in zip(ids, ("client", "client", "helper"), strict=True):
        assert page.is_checked(f'input[name="role-{device}"][value="{role}"]')
    assert page.input_value("#id_batches") == "5"
    visit.screenshot("split-train-error")
    page.fill("#id_sigma2", "5")
    page.click("text=Create and plan")
    # Assert: the run's page, the run planned by the worker with each method
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert page.inner_text("h1").startswith("split on three devices")
    page.wait_for_selector("#run-state.badge-planned", timeout=PLANNED_WITHIN_MS)
    run = user.get(f"/api/runs/{run_id}/")
    assert run["kind"] == "split" and run["state"] == "planned"
    assert (run["epochs"], run["batches"]) == (2, 5)
    plans = user.get(f"/api/runs/{run_id}/plans/")
    assert sorted(p["algorithm"] for p in plans) == sorted(METHODS)
    assert all(p["status"] == "done" for p in plans), plans
    assert run["split"]["clients"] == [d["uid"] for d in enrolled[:2]]
    assert run["split"]["helpers"] == [enrolled[2]["uid"]]
    assert run["split"]["cuts"] == {"sigma1": 2, "sigma2": 5}
    assert page.locator("#pipeline .tag").count() == 3  # the run's devices, clients first
    visit.screenshot("split-train-run")
