"""PipeLearn trained on devices, from the browser: three enrolled devices that profiled a model,
one chosen as the server and two as devices on /runs/new/pipelearn/ (a device's P beyond the
model's layers refused first, the error on its row and the rest of the form as typed), then
the PipeLearn run on its page while the server's Celery worker plans it with PipeLearn, SFL
and FL. Screenshots in tests/artifacts/."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import Server, Visit
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

METHODS = ("pipelearn", "sfl", "fl")  # the page's defaults: all three
PLANNED_WITHIN_MS = 60_000


def test_train_pipelearn_on_three_devices_from_the_form(visit: Visit, server: Server):
    # Prepare: three devices enrolled, each with its profile of an 8-layer model
    user = server.api()
    spec, devices = generated_testbed(seed=37, layers=19, devices=3)
    spec_id, enrolled = enrol(user, spec, devices)
    server_id, *client_ids = [d["id"] for d in enrolled]
    page = visit.page
    visit.login(server.password)
    # Execute: from the new-run page to the PipeLearn form, a server and two devices
    visit.go("/runs/new/")
    page.click("text=PipeLearn: a server and devices that keep their data")
    page.wait_for_url(re.compile(r"/runs/new/pipelearn/$"))
    page.fill("#id_name", "pipelearn on three devices")
    page.select_option("#id_model_spec", str(spec_id))
    assert re.search(r"\d\.\d\d× · 16 GiB · ",
                     page.locator(f'[data-device="{server_id}"]').inner_text())
    page.check(f"#server-{server_id}")
    for device in client_ids:
        page.check(f"#client-{device}")
    assert [m for m in METHODS if page.is_checked(f"#method-{m}")] == list(METHODS)
    page.fill("#id_batch_size", "8")
    page.fill("#id_batches", "3")
    page.fill("#id_epochs", "2")
    page.fill(f"#id_split-{client_ids[0]}", "19")  # layers 0..18: nothing left on the server
    page.fill(f"#id_parallel_batches-{client_ids[0]}", "2")
    page.click("text=Create and plan")
    # refused: the reason on the device's row, the rest of the form as it was
    error = page.locator(f'[data-device="{client_ids[0]}"] [data-for="device-{client_ids[0]}"]')
    assert error.inner_text() == ("P: must be from 1 to 18 (layers [0, P) on the device, the "
                                  "rest on the server), got 19")
    assert page.locator(".field-error").count() == 1
    assert page.input_value("#id_name") == "pipelearn on three devices"
    assert page.input_value("#id_model_spec") == str(spec_id)
    assert page.is_checked(f"#server-{server_id}")
    assert all(page.is_checked(f"#client-{d}") for d in client_ids)
    assert page.input_value("#id_batch_size") == "8"
    assert page.input_value(f"#id_parallel_batches-{client_ids[0]}") == "2"
    visit.screenshot("pipelearn-form-error")
    page.fill(f"#id_split-{client_ids[0]}", "3")
    page.click("text=Create and plan")
    # Assert: the run's page, the run planned by the worker with each method
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert page.inner_text("h1").startswith("pipelearn on three devices")
    page.wait_for_selector("#run-state.badge-planned", timeout=PLANNED_WITHIN_MS)
    run = user.get(f"/api/runs/{run_id}/")
    assert run["kind"] == "pipelearn" and run["state"] == "planned"
    assert (run["epochs"], run["batches"]) == (2, 3)
    assert run["pipelearn"]["server"] == enrolled[0]["uid"]
    assert run["pipelearn"]["clients"] == [d["uid"] for d in enrolled[1:]]
    assert run["pipelearn"]["batch_size"] == 8
    assert run["pipelearn"]["overrides"] == {enrolled[1]["uid"]: [3, 2]}
    plans = user.get(f"/api/runs/{run_id}/plans/")
    assert sorted(p["algorithm"] for p in plans) == sorted(METHODS)
    assert all(p["status"] == "done" for p in plans), plans
    visit.screenshot("pipelearn-form-run")
