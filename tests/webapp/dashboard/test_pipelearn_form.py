"""The form that trains PipeLearn on devices (/runs/new/pipelearn/): it offers the profiled
models, each device as the server, a device or left out (with its own P and N, empty for the
planner to choose), and the methods; a good form creates a PipeLearn run, queues its planning
and goes to the run's page; a refused one shows each error by its field (a device's P and N by
its row), keeps what was typed and creates nothing."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.test import Client

from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory
from tests.webapp.split.test_train_form import checked
from tests.webapp.split.test_views import field_errors
from webapp.devices.models import Device
from webapp.runs.models import Plan, Run

pytestmark = pytest.mark.django_db

PAGE = "/runs/new/pipelearn/"


@pytest.fixture
def profiled() -> tuple[int, list[Device]]:
    """The zoo's mlp (4 layers, batch 32) profiled on three devices, the last a fast server."""
    spec = ModelSpecFactory(model="mlp")
    devices = [DeviceFactory(name=f"edge {k}") for k in range(3)]
    for k, device in enumerate(devices):
        LayerProfileFactory(device=device, model_spec=spec, layers=4,
                            scale=0.25 if k == 2 else 1.0 + 0.5 * k)
    return spec.pk, devices


def pipelearn_form(spec: int, server: Device | None, clients: list[Device],
                   overrides: dict[Device, tuple[str, str]] | None = None,
                   **changes: Any) -> dict[str, Any]:
    form: dict[str, Any] = {"name": "pl on the bench", "model_spec": str(spec),
                            "clients": [str(d.pk) for d in clients],
                            "methods": ["pipelearn", "sfl", "fl"], "batch_size": "16",
                            "batches": "4", "epochs": "2", "shard_split": "label-skew",
                            "lr": "0.05"}
    if server is not None:
        form["server"] = str(server.pk)
    for d, (split, parallel) in (overrides or {}).items():
        form[f"split-{d.pk}"], form[f"parallel_batches-{d.pk}"] = split, parallel
    form.update(changes)
    return form


def row_html(html: str, device: Device) -> str:
    row = re.search(rf'data-device="{device.pk}"[^>]*>(.*?)</div>', html, re.S)
    assert row is not None, device
    return unescape(row.group(1))


def test_the_page_asks_for_the_login_first(client: Client):
    answer = client.get(PAGE)
    assert answer.status_code == 302 and answer["Location"] == f"/login/?next={PAGE}"


def test_the_page_offers_the_models_each_device_as_server_or_device_and_the_methods(
        viewer, profiled):
    spec, devices = profiled
    html = viewer.get(PAGE).content.decode()
    assert re.search(rf'<option value="{spec}">mlp · digits · batch 32 · 4 layers '
                     r"\(profiled on 3 devices\)</option>", html)
    for d in devices:  # at first neither the server nor a device; P and N for the planner
        assert not checked(html, "server", str(d.pk)) and not checked(html, "clients", str(d.pk))
        row = row_html(html, d)
        assert d.name in row and "· 4 GiB · 12.5 MB/s · profiled mlp/digits" in row
        for name in ("split", "parallel_batches"):
            assert f'name="{name}-{d.pk}" min="1" value="" placeholder="auto"' in row
    for method in ("pipelearn", "sfl", "fl"):
        assert checked(html, "methods", method)
    # the API's defaults: B the model's, 10 iterations an epoch, 3 epochs, iid
    assert 'name="batch_size" min="1" max="4096" value="" placeholder="the model\'s batch"' \
        in html
    assert 'name="batches" min="1" value="10"' in html
    assert 'name="epochs" min="1" value="3"' in html
    assert checked(html, "shard_split", "iid") and not checked(html, "shard_split", "label-skew")


def test_the_new_run_page_links_to_it(viewer, profiled):
    html = viewer.get("/runs/new/").content.decode()
    assert f'<a href="{PAGE}" id="new-pipelearn">PipeLearn: a server and devices that keep ' \
           "their data →</a>" in html


def test_a_good_form_creates_a_pipelearn_run_plans_it_and_goes_to_its_page(
        viewer, profiled, django_capture_on_commit_callbacks):
    spec, devices = profiled
    with django_capture_on_commit_callbacks(execute=True) as queued:
        answer = viewer.post(PAGE, pipelearn_form(spec, devices[2], devices[:2],
                                                  {devices[1]: ("2", "4")}))
    run = Run.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/runs/{run.pk}/"
    assert queued  # planning queued with the run's commit
    assert run.kind == "pipelearn" and run.name == "pl on the bench"
    assert (run.epochs, run.batches, run.lr) == (2, 4, 0.05)
    assert run.pipelearn == {"server": devices[2].uid, "clients": [d.uid for d in devices[:2]],
                             "batch_size": 16, "shard_split": "label-skew",
                             "overrides": {devices[1].uid: [2, 4]}}
    assert run.algorithms == ["pipelearn", "sfl", "fl"]
    assert run.state == Run.State.PLANNED, run.error
    plans = {p.algorithm: p for p in Plan.objects.filter(run=run)}
    assert set(plans) == {"pipelearn", "sfl", "fl"}
    assert {p.status for p in plans.values()} == {Plan.Status.DONE}
    chosen = plans["pipelearn"].document["devices"][devices[1].uid]
    assert (chosen["split"], chosen["parallel_batches"]) == (2, 4)
    assert "pl on the bench" in viewer.get(answer["Location"]).content.decode()


def test_b_left_empty_is_the_model_s_and_one_method_plans_once(
        viewer, profiled, django_capture_on_commit_callbacks):
    spec, devices = profiled
    with django_capture_on_commit_callbacks(execute=True):
        viewer.post(PAGE, pipelearn_form(spec, devices[0], devices[1:], batch_size="",
                                         methods=["sfl"]))
    run = Run.objects.get()
    assert run.pipelearn["batch_size"] == 32 and run.algorithms == ["sfl"]
    assert [p.algorithm for p in Plan.objects.filter(run=run)] == ["sfl"]


def bad_forms(spec: int, devices: list[Device]) -> list[tuple[dict[str, Any], str, str]]:
    server, *clients = devices[2], devices[0], devices[1]
    return [
        (pipelearn_form(spec, None, clients), "server",
         "choose one device as the server: it trains every device's last layers"),
        (pipelearn_form(spec, server, [*clients, server]), "clients",
         f"device {server.pk} ({server.uid}) is the server"),
        (pipelearn_form(spec, server, []), "clients",
         "tick at least one other device: each keeps its data and trains the first layers"),
        # mlp has 4 layers: the server keeps at least the last
        (pipelearn_form(spec, server, clients, {clients[0]: ("4", "2")}),
         f"device-{clients[0].pk}",
         "P: must be from 1 to 3 (layers [0, P) on the device, the rest on the server), got 4"),
        (pipelearn_form(spec, server, clients, {clients[1]: ("2", "17")}),
         f"device-{clients[1].pk}",
         "N: must be from 1 to 16 (micro-batches of B // N, B = 16), got 17"),
        (pipelearn_form(spec, server, clients, {clients[1]: ("2", "")}),
         f"device-{clients[1].pk}", "give both P and N, or leave both empty for the planner "
                                    "to choose"),
        (pipelearn_form(spec, server, clients, {server: ("1", "1")}), f"device-{server.pk}",
         "P and N are a device's of the run: tick it as a device, or clear them"),
        (pipelearn_form(spec, server, clients, {clients[0]: ("one", "2")}),
         f"device-{clients[0].pk}", "P: must be an integer"),
        (pipelearn_form(spec, server, clients, methods=[]), "methods",
         "tick at least one method: each plans the run once"),
        (pipelearn_form(spec, server, clients, batches="many"), "batches",
         "must be an integer"),
    ]


@pytest.mark.parametrize("case", range(10))
def test_a_bad_form_shows_the_error_by_its_field_and_creates_nothing(viewer, profiled, case):
    spec, devices = profiled
    form, field, reason = bad_forms(spec, devices)[case]
    answer = viewer.post(PAGE, form)
    html = answer.content.decode()
    assert answer.status_code == 200
    assert field_errors(html, field) == [reason]
    assert len(re.findall(r'class="field-error"', html)) == 1
    assert "The run was not created: see the fields marked below." in html
    assert not Run.objects.exists()
    # the form as it was typed
    assert 'value="pl on the bench"' in html
    assert f'<option value="{spec}" selected>' in html
    assert checked(html, "server", str(devices[2].pk)) == ("server" in form)
    for d in devices:
        assert checked(html, "clients", str(d.pk)) == (str(d.pk) in form["clients"])
        for name in ("split", "parallel_batches"):
            assert f'name="{name}-{d.pk}" min="1" value="{form.get(f"{name}-{d.pk}", "")}"' \
                in html
    assert checked(html, "shard_split", "label-skew")
    assert checked(html, "methods", "fl") == ("fl" in form["methods"])
    assert re.search(rf'name="batches" min="1" value="{form["batches"]}"', html)
    assert 'name="batch_size" min="1" max="4096" value="16"' in html


def test_a_device_without_the_model_s_profile_is_named_on_the_devices(viewer, profiled):
    spec, devices = profiled
    newcomer = DeviceFactory(name="new phone")
    html = viewer.post(PAGE, pipelearn_form(spec, devices[2], [devices[0], newcomer])
                       ).content.decode()
    assert field_errors(html, "devices") == [
        "new phone has not profiled mlp on digits, batch 32: have it profile the model first, "
        "or leave it out of the run"]
    assert "has not profiled this model" in row_html(html, newcomer)
    assert f'class="choice unprofiled" data-device="{newcomer.pk}"' in html
    assert not Run.objects.exists()


def test_without_a_profiled_model_the_page_says_what_to_do(viewer):
    DeviceFactory()
    html = viewer.get(PAGE).content.decode()
    assert "No model has been profiled yet" in html and "<form" not in html.split("<main")[-1]
