"""The form that trains split learning on devices (/split/train/): it offers the profiled models,
each device's role and the methods; a good form creates a split run, queues its planning and
goes to the run's page; a refused one shows each error next to its field, keeps what was
typed and creates nothing."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.test import Client

from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    UserFactory,
)
from tests.webapp.split.factories import SplitScheduleFactory
from tests.webapp.split.test_views import field_errors
from webapp.devices.models import Device
from webapp.runs.models import Plan, Run
from webapp.split.selectors import DEFAULT_METHODS

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser() -> Client:
    client = Client()
    client.force_login(UserFactory())
    return client


@pytest.fixture
def profiled() -> tuple[int, list[Device]]:
    """The zoo's mlp (4 layers) profiled on three devices: two clients, a faster helper."""
    spec = ModelSpecFactory(model="mlp")
    devices = [DeviceFactory(name=f"edge {k}") for k in range(3)]
    for k, device in enumerate(devices):
        LayerProfileFactory(device=device, model_spec=spec, layers=4,
                            scale=0.25 if k == 2 else 1.0)
    return spec.pk, devices


def train_form(spec: int, clients: list[Device], helpers: list[Device],
               **changes: Any) -> dict[str, Any]:
    form: dict[str, Any] = {"name": "sl on the bench", "model_spec": str(spec),
                            "methods": ["balanced-greedy", "exact"], "sigma1": "0",
                            "sigma2": "1", "epochs": "2", "batches": "4",
                            "shard_split": "label-skew", "time_limit_s": "1", "lr": "0.05"}
    roles: dict[int, list[str]] = {}
    for role, devices in (("client", clients), ("helper", helpers)):
        for d in devices:
            roles.setdefault(d.pk, []).append(role)
    form.update({f"role-{pk}": chosen for pk, chosen in roles.items()})
    form.update(changes)
    return form


def checked(html: str, name: str, value: str) -> bool:
    box = re.search(rf'<input type="(?:radio|checkbox)" name="{name}" value="{value}"'
                    r'[^>]*?( checked)?>', html)
    assert box is not None, (name, value)
    return box.group(1) is not None


def test_the_page_asks_for_the_login_first(client: Client):
    answer = client.get("/split/train/")
    assert answer.status_code == 302 and answer["Location"] == "/login/?next=/split/train/"


def test_the_page_offers_the_profiled_models_each_device_s_role_and_the_methods(
        browser, profiled):
    spec, devices = profiled
    html = browser.get("/split/train/").content.decode()
    assert re.search(rf'<option value="{spec}">mlp · digits · batch 32 · 4 layers '
                     r"\(profiled on 3 devices\)</option>", html)
    for d in devices:  # each a client, a helper or (at first) left out, with what it measured
        assert [checked(html, f"role-{d.pk}", r) for r in ("client", "helper", "out")] == [
            False, False, True]
        row = re.search(rf'data-device="{d.pk}">(.*?)</div>', html, re.S)
        assert row is not None and d.name in row.group(1)
        assert "1.00× · 4 GiB · 12.5 MB/s · profiled mlp/digits" in unescape(row.group(1))
    for method in ("exact", "admm", "balanced-greedy", "random-fcfs", "auto"):
        assert checked(html, "methods", method) == (method in DEFAULT_METHODS)
    assert "labels never leave the client" in html
    assert "<b>part-2</b> = layers sigma1+1..sigma2, on its helper" in html
    # the API's defaults: 3 rounds of 20 batches, iid, 5 s
    for name, value in (("epochs", "3"), ("batches", "20"), ("time_limit_s", "5")):
        assert f'name="{name}" min="1" value="{value}"' in html or \
            f'name="{name}" step="any" value="{value}"' in html
    assert checked(html, "shard_split", "iid") and not checked(html, "shard_split", "label-skew")


def test_a_study_s_methods_come_ticked_from_its_link(browser, profiled):
    schedule = SplitScheduleFactory(method="exact")
    SplitScheduleFactory(study=schedule.study, method="admm")
    study = browser.get(f"/split/{schedule.study.pk}/").content.decode()
    link = re.search(r'<a class="btn" id="train-plan" href="([^"]+)"', study)
    assert link is not None and unescape(link.group(1)) == \
        "/split/train/?methods=exact&methods=admm"
    html = browser.get(unescape(link.group(1))).content.decode()
    assert [m for m in ("exact", "admm", "balanced-greedy", "random-fcfs", "auto")
            if checked(html, "methods", m)] == ["exact", "admm"]
    # comma-separated works too; an unknown method is not offered
    html = browser.get("/split/train/?methods=auto,nope").content.decode()
    assert checked(html, "methods", "auto") and not checked(html, "methods", "exact")
    assert 'href="/split/train/"' in browser.get("/split/").content.decode()


def test_a_good_form_creates_a_split_run_plans_it_and_goes_to_its_page(
        browser, profiled, django_capture_on_commit_callbacks):
    spec, devices = profiled
    with django_capture_on_commit_callbacks(execute=True) as queued:
        answer = browser.post("/split/train/", train_form(spec, devices[:2], devices[2:]))
    run = Run.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/runs/{run.pk}/"
    assert queued  # planning queued with the run's commit
    assert run.kind == "split" and run.name == "sl on the bench"
    assert (run.epochs, run.batches, run.lr) == (2, 4, 0.05)
    assert run.split["clients"] == [d.uid for d in devices[:2]]
    assert run.split["helpers"] == [devices[2].uid]
    assert run.split["cuts"] == {"sigma1": 0, "sigma2": 1}
    assert run.split["shard_split"] == "label-skew" and run.split["time_limit_s"] == 1.0
    assert sorted(run.algorithms) == ["balanced-greedy", "exact"]
    assert run.state == Run.State.PLANNED, run.error
    assert {p.status for p in Plan.objects.filter(run=run)} == {Plan.Status.DONE}
    assert "sl on the bench" in browser.get(answer["Location"]).content.decode()


def bad_forms(spec: int, devices: list[Device]) -> list[tuple[dict[str, Any], str, str]]:
    return [
        # mlp has 4 layers: part-3 would be empty
        (train_form(spec, devices[:2], devices[2:], sigma2="3"), "sigma2",
         "must be at most 2 so that part-3 (layers sigma2+1..3) is not empty, got 3"),
        (train_form(spec, devices[:2], devices[1:]), "helpers",
         f"{devices[1].uid!r} is also a client; a device is one client or one helper"),
        (train_form(spec, devices, []), "helpers",
         "choose at least one device as a helper (it trains part-2 for the clients a plan "
         "gives it)"),
        (train_form(spec, devices[:2], devices[2:], sigma1="1"), "sigma2",
         "must be after sigma1 (1) so that part-2 (layers sigma1+1..sigma2) is not empty, got 1"),
        (train_form(spec, devices[:2], devices[2:], methods=[]), "methods",
         "tick at least one method: each plans the run once"),
        (train_form(spec, devices[:2], devices[2:], batches="many"), "batches",
         "must be an integer"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_a_bad_form_shows_the_error_next_to_its_field_and_creates_nothing(
        browser, profiled, case):
    spec, devices = profiled
    form, field, reason = bad_forms(spec, devices)[case]
    answer = browser.post("/split/train/", form)
    html = answer.content.decode()
    assert answer.status_code == 200
    assert field_errors(html, field) == [reason]
    assert len(re.findall(r'class="field-error"', html)) == 1
    assert "The run was not created: see the fields marked below." in html
    assert not Run.objects.exists()
    # the form as it was typed
    assert 'value="sl on the bench"' in html
    assert f'<option value="{spec}" selected>' in html
    assert checked(html, f"role-{devices[0].pk}", "client")
    assert checked(html, "shard_split", "label-skew")
    assert checked(html, "methods", "exact") == ("exact" in form["methods"])
    assert re.search(rf'name="batches" min="1" value="{form["batches"]}"', html)


def test_a_device_without_the_model_s_profile_is_named_on_the_devices(browser, profiled):
    spec, devices = profiled
    newcomer = DeviceFactory(name="new phone")
    html = browser.post("/split/train/", train_form(spec, [*devices[:2], newcomer],
                                                    devices[2:])).content.decode()
    assert field_errors(html, "devices") == [
        "new phone has not profiled mlp on digits, batch 32: have it profile the model first, "
        "or leave it out of the run"]
    row = re.search(rf'data-device="{newcomer.pk}">(.*?)</div>', html, re.S)
    assert row is not None and "has not profiled this model" in row.group(1)
    assert 'class="choice unprofiled" data-device' in html
    assert not Run.objects.exists()


def test_without_a_profiled_model_the_page_says_what_to_do(browser):
    DeviceFactory()
    html = browser.get("/split/train/").content.decode()
    assert "No model has been profiled yet" in html and "<form" not in html.split("<main")[-1]
