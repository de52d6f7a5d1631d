"""The dashboard's pages: login, empty states, many runs, and forms whose errors appear next to
the field they name (the REST API's validation, reused)."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client

from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    PlanFactory,
    RunFactory,
)
from webapp.devices.models import Device, EnrollmentToken
from webapp.runs.models import AGGREGATE_EVERY_MAX, MOMENTUM_MAX, Plan, Run

pytestmark = pytest.mark.django_db

PAGES = ["/", "/devices/", "/runs/", "/runs/new/"]


def field_errors(html: str, field: str) -> list[str]:
    """The errors shown under form field ``field`` (the template marks each with the field's
    name, inside the field's own box)."""
    return [unescape(e) for e in
            re.findall(rf'<div class="field-error" data-for="{field}">(.*?)</div>', html)]


@pytest.mark.parametrize("path", [*PAGES, "/runs/1/", "/devices/1/"])
def test_every_page_asks_for_the_login_first(client: Client, path):
    answer = client.get(path)
    assert answer.status_code == 302 and answer["Location"] == f"/login/?next={path}"


def test_the_login_page_says_what_went_wrong(client: Client, user):
    answer = client.post("/login/", {"username": user.username, "password": "nope"})
    assert answer.status_code == 200
    assert "Please enter a correct username and password" in answer.content.decode()
    answer = client.post("/login/", {"username": user.username, "password": "pass-word-1",
                                     "next": "/runs/"})
    assert answer.status_code == 302 and answer["Location"] == "/runs/"


def test_log_out_is_a_post_back_to_the_login(browser: Client):
    answer = browser.post("/logout/")
    assert answer.status_code == 302 and answer["Location"] == "/login/"
    assert browser.get("/runs/").status_code == 302


@pytest.mark.parametrize(("path", "says"), [
    ("/", "Getting started"),
    ("/devices/", "No devices yet"),
    ("/runs/", "No runs yet"),
    ("/runs/new/", "No device can train yet"),
])
def test_pages_with_nothing_yet_say_what_to_do(browser: Client, path, says):
    answer = browser.get(path)
    assert answer.status_code == 200
    assert says in answer.content.decode()


def test_the_new_run_form_says_when_no_model_is_profiled(browser: Client):
    DeviceFactory()
    assert "No model has been profiled yet" in browser.get("/runs/new/").content.decode()


def test_hundreds_of_runs_are_paged_and_filtered(browser: Client, django_assert_max_num_queries):
    devices = [DeviceFactory(), DeviceFactory()]
    spec = ModelSpecFactory()
    for k in range(230):
        RunFactory(devices=devices, model_spec=spec, name=f"run number {k}",
                   state=Run.State.RUNNING if k % 10 == 0 else Run.State.PLANNED)
    with django_assert_max_num_queries(80):
        answer = browser.get("/runs/")
    html = answer.content.decode()
    assert html.count("run number ") == 50 and "run number 229" in html
    assert "Runs 1–50 of 230" in html and "Page 1 of 5" in html
    last = browser.get("/runs/?page=5").content.decode()
    assert last.count("run number ") == 30 and "run number 0<" in last
    active = browser.get("/runs/?state=active").content.decode()
    assert active.count("run number ") == 23
    assert 'Active<span class="count">23</span>' in active


def test_the_run_list_shows_progress(browser: Client):
    planning = RunFactory(state=Run.State.PLANNING)
    PlanFactory(run=planning, algorithm="uniform")
    PlanFactory(run=planning, algorithm="optimal", status=Plan.Status.RUNNING)
    RunFactory(state=Run.State.FINISHED, microbatches=4, batches=10)
    html = browser.get("/runs/").content.decode()
    assert "1/2 plans" in html and "done" in html


def test_a_run_page_carries_its_live_configuration(browser: Client, gpipe_run: Run):
    html = browser.get(f"/runs/{gpipe_run.pk}/").content.decode()
    assert f'"ws_path": "/ws/runs/{gpipe_run.pk}/"' in html
    assert f"/api/dashboard/runs/{gpipe_run.pk}/plans/{{plan}}/timeline/" in html
    assert "has the shortest predicted period" in html  # why the best is best
    assert "/static/vendor/plotly.min.js" in html


def test_a_run_page_with_a_training_plan_has_the_place_for_its_curve(browser: Client):
    run = RunFactory(state=Run.State.PLANNING, algorithms=["tapp"])
    PlanFactory(run=run, algorithm="tapp", status=Plan.Status.RUNNING, period_s=None,
                training={"episodes": [1, 2], "best_reward": [-0.9, -0.8],
                          "mean_reward": [-1.2, -1.0]})
    answer = browser.get(f"/runs/{run.pk}/")
    html = answer.content.decode()
    assert answer.status_code == 200
    # drawn by run.js (with charts.js) from the plans of the snapshot and the plan events
    assert 'id="plan-trainings-box" hidden' in html and 'id="plan-trainings"' in html
    assert "/static/dashboard/js/charts.js" in html and "/static/dashboard/js/run.js" in html


def test_an_unknown_run_or_device_is_a_404_page(browser: Client):
    for path in ("/runs/999/", "/devices/999/"):
        answer = browser.get(path)
        assert answer.status_code == 404 and answer["Content-Type"].startswith("text/html")


# --------------------------------------------------------------------------- new run


@pytest.fixture
def profiled(db: None) -> tuple[int, list[Device]]:
    spec = ModelSpecFactory()
    devices = [DeviceFactory(name=f"edge {k}") for k in range(3)]
    for device in devices:
        LayerProfileFactory(device=device, model_spec=spec, layers=5)
    return spec.pk, devices


def run_form(spec: int, chosen: list[Device], **changes: object) -> dict[str, object]:
    form: dict[str, object] = {"name": "lab run", "model_spec": str(spec),
                               "devices": [str(d.pk) for d in chosen],
                               "algorithms": ["ftpipehd", "uniform"], "schedule": "1f1b",
                               "microbatches": "4", "batches": "10", "lr": "0.05",
                               "momentum": "0.9"}
    form.update(changes)
    return {k: v for k, v in form.items() if v is not None}


def test_a_run_is_created_in_pipeline_order_and_planned(browser: Client, profiled,
                                                        django_capture_on_commit_callbacks):
    spec, devices = profiled
    chosen = [devices[2], devices[0]]
    with django_capture_on_commit_callbacks(execute=True):
        answer = browser.post("/runs/new/", run_form(spec, chosen))
    run = Run.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/runs/{run.pk}/"
    assert [rd.device for rd in run.run_devices.all()] == chosen
    assert run.state == Run.State.PLANNED and run.microbatches == 4
    assert (run.lr, run.momentum) == (0.05, 0.9)
    assert sorted(run.plans.values_list("algorithm", flat=True)) == ["ftpipehd", "uniform"]
    assert "SGD lr 0.05, momentum 0.9" in browser.get(answer["Location"]).content.decode()
    # the fault-tolerance settings left as the form shows them: the run's defaults
    assert (run.chain_every, run.global_every, run.repartition_after, run.repartition_every,
            run.recovery_policy) == (2, 10, 10, 100, "replan")


def test_the_form_sets_the_fault_tolerance_settings(browser: Client, profiled):
    spec, devices = profiled
    form = run_form(spec, devices, chain_every="1", global_every="0", repartition_after="3",
                    repartition_every="0", recovery_policy="respipe")
    page = browser.get("/runs/new/").content.decode()
    for name in ("chain_every", "global_every", "repartition_after", "repartition_every",
                 "recovery_policy", "lr", "momentum", "vertical_sync", "aggregate_every"):
        assert f'name="{name}"' in page
    # the runs' default rate kept the demo's VGG-5 at chance under 1F1B with vertical sync
    assert "a lower rate may be needed" in page
    assert browser.post("/runs/new/", form).status_code == 302
    run = Run.objects.get()
    assert (run.chain_every, run.global_every, run.repartition_after, run.repartition_every,
            run.recovery_policy) == (1, 0, 3, 0, "respipe")


def vertical_sync_ticked(page: str) -> bool:
    """Is the form's vertical sync box ticked? (Sent after a hidden "off", so that an unticked
    box says so.)"""
    boxes = re.findall(r'<input type="checkbox" id="id_vertical_sync" name="vertical_sync" '
                       r'value="on"( checked)?>', page)
    assert len(boxes) == 1 and '<input type="hidden" name="vertical_sync" value="off">' in page
    return boxes == [" checked"]


@pytest.mark.parametrize(("ticked", "aggregate_every", "shown"), [
    (True, "4", "1f1b, vertical sync, weight aggregation every 4 in-flight windows ·"),
    (False, "0", "1f1b, no vertical sync ·"),
    (False, "1", "1f1b, no vertical sync, weight aggregation every 1 in-flight window ·"),
])
def test_the_form_sets_vertical_sync_and_weight_aggregation(browser: Client, profiled, ticked,
                                                             aggregate_every, shown):
    spec, devices = profiled
    sent = ["off", "on"] if ticked else ["off"]  # what the browser sends for the box
    answer = browser.post("/runs/new/", run_form(spec, devices, vertical_sync=sent,
                                                 aggregate_every=aggregate_every))
    assert answer.status_code == 302
    run = Run.objects.get()
    assert (run.vertical_sync, run.aggregate_every) == (ticked, int(aggregate_every))
    assert shown in browser.get(answer["Location"]).content.decode()  # the run page says so


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b-sync"])
def test_a_synchronous_run_page_shows_neither_vertical_sync_nor_aggregation(
        browser: Client, schedule):
    run = RunFactory(schedule=schedule, vertical_sync=True)
    html = browser.get(f"/runs/{run.pk}/").content.decode()
    assert f"{run.model_spec} · {schedule} · " in html and "vertical sync" not in html


@pytest.mark.parametrize(("microbatches", "batches", "says"), [
    (1, 1, "1 micro-batch × 1 batch ·"), (4, 10, "4 micro-batches × 10 batches ·")])
def test_a_run_page_counts_in_words_that_agree(browser: Client, microbatches, batches, says):
    run = RunFactory(microbatches=microbatches, batches=batches)
    html = unescape(browser.get(f"/runs/{run.pk}/").content.decode())
    assert says in html


def test_the_run_form_makes_a_synchronous_1f1b_run(browser: Client, profiled):
    spec, devices = profiled
    page = browser.get("/runs/new/").content.decode()
    assert re.findall(r'name="schedule" value="([\w-]+)"', page) == ["1f1b", "1f1b-sync", "gpipe"]
    answer = browser.post("/runs/new/", run_form(spec, devices, schedule="1f1b-sync"))
    assert answer.status_code == 302
    assert Run.objects.get().schedule == "1f1b-sync"
    refused = browser.post("/runs/new/", run_form(spec, devices, schedule="1f1b-sync",
                                                  batches="0")).content.decode()
    assert re.findall(r'name="schedule" value="([\w-]+)" checked', refused) == ["1f1b-sync"]


@pytest.mark.parametrize("ticked", [True, False])
def test_a_refused_form_keeps_vertical_sync_and_weight_aggregation(browser: Client, profiled,
                                                                  ticked):
    spec, devices = profiled
    page = browser.post("/runs/new/", run_form(
        spec, devices, vertical_sync=["off", "on"] if ticked else ["off"],
        aggregate_every="7", batches="0")).content.decode()
    assert field_errors(page, "batches") == ["Ensure this value is greater than or equal to 1."]
    assert vertical_sync_ticked(page) is ticked
    assert 'name="aggregate_every" value="7"' in page


def test_weight_aggregation_under_gpipe_is_refused_next_to_its_field(browser: Client, profiled):
    spec, devices = profiled
    page = browser.post("/runs/new/", run_form(spec, devices, schedule="gpipe",
                                               vertical_sync=["off"],
                                               aggregate_every="2")).content.decode()
    assert field_errors(page, "aggregate_every") == [
        "must be 0 under gpipe: weight aggregation is for the stale weight versions of "
        "asynchronous 1f1b"]
    assert not Run.objects.exists()
    assert not vertical_sync_ticked(page) and 'name="aggregate_every" value="2"' in page
    assert re.findall(r'name="schedule" value="(\w+)" checked', page) == ["gpipe"]


def test_a_refused_form_keeps_the_recovery_policy_chosen(browser: Client, profiled):
    spec, devices = profiled
    page = browser.post("/runs/new/", run_form(spec, devices, recovery_policy="respipe",
                                               batches="0")).content.decode()
    assert "Ensure this value is greater than or equal to 1." in page
    assert re.findall(r'name="recovery_policy" value="(\w+)" checked', page) == ["respipe"]


def test_the_form_starts_at_the_runs_own_defaults(browser: Client, profiled):
    spec, devices = profiled
    page = browser.get("/runs/new/").content.decode()
    shown = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page))
    numbers = ("microbatches", "batches", "lr", "momentum", "aggregate_every", "chain_every",
               "global_every", "repartition_after", "repartition_every")
    defaults = {name: Run._meta.get_field(name).default for name in numbers}
    assert {name: float(shown[name]) for name in numbers} == defaults
    checked = re.findall(r'name="recovery_policy" value="(\w+)" checked', page)
    assert checked == [Run._meta.get_field("recovery_policy").default]
    assert Run._meta.get_field("vertical_sync").default is True
    assert vertical_sync_ticked(page)
    assert f"0 to {MOMENTUM_MAX}." in page  # the momentum's limit, as the API enforces it
    assert f"0 to {AGGREGATE_EVERY_MAX}." in page
    # submitted as shown, the form makes a run with exactly those settings
    assert browser.post("/runs/new/", run_form(spec, devices, vertical_sync=["off", "on"], **{
        name: shown[name] for name in numbers})).status_code == 302
    run = Run.objects.get()
    assert {name: getattr(run, name) for name in numbers} == defaults
    assert run.vertical_sync is True


@pytest.mark.parametrize(("changes", "field", "reason"), [
    ({"name": ""}, "name", "This field may not be blank."),
    ({"model_spec": ""}, "model_spec", "This field is required."),
    ({"model_spec": "9999"}, "model_spec", 'Invalid pk "9999" - object does not exist.'),
    ({"devices": None}, "devices", "This list may not be empty."),
    ({"algorithms": None}, "algorithms", "This list may not be empty."),
    ({"algorithms": ["ftpipehd", "nonsense"]}, "algorithms",
     "unknown algorithm 'nonsense'; known: uniform, pipedream, ftpipehd, optimal, pipetorch, "
     "bsp, duanwu, tapp"),
    ({"schedule": "zigzag"}, "schedule", '"zigzag" is not a valid choice.'),
    ({"microbatches": "0"}, "microbatches", "Ensure this value is greater than or equal to 1."),
    ({"microbatches": "four"}, "microbatches", "must be an integer"),
    ({"batches": ""}, "batches", "must be an integer"),
    ({"lr": "0"}, "lr", "Ensure this value is greater than or equal to 1e-09."),
    ({"lr": "fast"}, "lr", "must be a finite number"),
    ({"momentum": "1"}, "momentum", "Ensure this value is less than or equal to 0.999."),
    ({"momentum": "nan"}, "momentum", "must be a finite number"),
    ({"chain_every": "-1"}, "chain_every", "Ensure this value is greater than or equal to 0."),
    ({"global_every": "often"}, "global_every", "must be an integer"),
    ({"repartition_after": "0"}, "repartition_after",
     "Ensure this value is greater than or equal to 1."),
    ({"recovery_policy": "pray"}, "recovery_policy", '"pray" is not a valid choice.'),
    ({"aggregate_every": "-1"}, "aggregate_every",
     "Ensure this value is greater than or equal to 0."),
    ({"aggregate_every": "1001"}, "aggregate_every",
     "Ensure this value is less than or equal to 1000."),
    ({"aggregate_every": "often"}, "aggregate_every", "must be an integer"),
])
def test_a_bad_value_is_refused_next_to_its_field(browser: Client, profiled, changes, field,
                                                  reason):
    spec, devices = profiled
    answer = browser.post("/runs/new/", run_form(spec, devices, **changes))
    html = answer.content.decode()
    assert answer.status_code == 200 and not Run.objects.exists()
    assert field_errors(html, field) == [reason]
    assert html.count('class="field has-error"') == 1
    assert 'value="lab run"' in html or field == "name"  # the rest is kept


def test_a_device_without_a_profile_is_named_next_to_the_devices(browser: Client, profiled):
    spec, devices = profiled
    newcomer = DeviceFactory(name="new pi")
    answer = browser.post("/runs/new/", run_form(spec, [*devices, newcomer]))
    assert field_errors(answer.content.decode(), "devices") == [
        "new pi has not profiled mlp on digits, batch 32: have it profile the model first, "
        "or leave it out of the run"]
    assert not Run.objects.exists()


def test_a_retired_device_is_refused_by_the_service(browser: Client, profiled):
    spec, devices = profiled
    Device.objects.filter(pk=devices[1].pk).update(status=Device.Status.RETIRED)
    answer = browser.post("/runs/new/", run_form(spec, devices))
    assert field_errors(answer.content.decode(), "devices") == [
        f"device {devices[1].pk} ({devices[1].uid}) is retired"]


def test_the_form_shows_the_chosen_devices_first_in_their_order(browser: Client, profiled):
    spec, devices = profiled
    answer = browser.post("/runs/new/", run_form(spec, [devices[2], devices[1]],
                                                 microbatches="0"))
    ids = [int(i) for i in re.findall(r'name="devices" value="(\d+)"', answer.content.decode())]
    assert ids == [devices[2].pk, devices[1].pk, devices[0].pk]


# --------------------------------------------------------------------------- devices


def test_add_device_shows_the_token_and_the_agent_commands(browser: Client):
    answer = browser.post("/devices/", {"name": "pi kitchen", "max_uses": "2"})
    html = answer.content.decode()
    token = EnrollmentToken.objects.get()
    assert token.label == "pi kitchen" and token.max_uses == 2
    secret = re.search(r"--token (ept_[\w-]+)", html).group(1)
    assert secret.startswith(token.prefix)
    assert "<code>pip install -r requirements-agent.txt</code>" in html
    assert (f"<code>python -m agent enrol --server http://testserver --token {secret} "
            f"--name &#x27;pi kitchen&#x27;</code>") in html
    assert "<code>python -m agent run</code>" in html


def test_add_device_refuses_a_bad_count_next_to_it(browser: Client):
    answer = browser.post("/devices/", {"name": "pi", "max_uses": "0"})
    assert field_errors(answer.content.decode(), "max_uses") == [
        "Ensure this value is greater than or equal to 1."]
    assert not EnrollmentToken.objects.exists()


def test_a_device_page_charts_its_profiles(browser: Client):
    profile = LayerProfileFactory(layers=3)
    html = browser.get(f"/devices/{profile.device.pk}/").content.decode()
    assert '"forward_s": 0.01' in html and '"name": "l2"' in html
    assert "mlp on digits, batch 32" in html


def test_a_device_page_shows_its_measured_fixed_costs(browser: Client):
    device = DeviceFactory(overhead_s=0.0012, message_s=0.00019)
    LayerProfileFactory(device=device, overhead_s=0.0031, message_s=0.0004)  # a run's
    html = browser.get(f"/devices/{device.pk}/").content.decode()
    assert "Fixed cost per micro-batch</dt><dd" in html and ">1.2 ms</dd>" in html
    assert "Cost per message sent</dt><dd" in html and ">190 µs</dd>" in html
    assert '"overhead_s": 0.0031, "message_s": 0.0004' in html  # the profile's, for its hint


def test_rename_and_retire(browser: Client):
    device = DeviceFactory(name="old name")
    refused = browser.post(f"/devices/{device.pk}/", {"name": ""})
    assert field_errors(refused.content.decode(), "name") == ["This field may not be blank."]
    renamed = browser.post(f"/devices/{device.pk}/", {"name": "new name"}, follow=True)
    assert "Renamed to new name." in renamed.content.decode()
    retired = browser.post(f"/devices/{device.pk}/retire/", follow=True)
    device.refresh_from_db()
    assert device.status == Device.Status.RETIRED and device.key_hash == ""
    assert "is retired" in retired.content.decode()
    assert browser.get(f"/devices/{device.pk}/retire/").status_code == 405


def test_measured_links_are_listed(browser: Client):
    from webapp.devices.models import DeviceLink

    pi, laptop = DeviceFactory(name="pi"), DeviceFactory(name="laptop")
    DeviceLink.objects.create(source=pi, target=laptop, bandwidth_bps=5e6, latency_s=0.004)
    devices_page = browser.get("/devices/").content.decode()
    assert '"source_name": "pi", "target": "' + laptop.uid in devices_page
    html = browser.get(f"/devices/{laptop.pk}/").content.decode()
    assert re.search(r"<td>pi</td><td>laptop</td><td class=\"num\">5 MB/s</td>"
                     r"<td class=\"num\">4 ms</td>", html)


def test_the_overview_counts_devices_and_runs(browser: Client):
    DeviceFactory(status=Device.Status.BUSY)
    DeviceFactory(status=Device.Status.OFFLINE)
    DeviceFactory(status=Device.Status.RETIRED)
    RunFactory(state=Run.State.RUNNING, name="the active one")
    html = browser.get("/").content.decode()
    # the busy device (training) is online: it read "0 / 3" while three devices trained
    assert re.search(r"Devices online</div><div class=\"value\">3<small> / 4</small>", html)
    assert re.search(r"Active runs</div><div class=\"value\">1<", html)
    assert "the active one" in html and "Getting started" not in html
