"""Plans whose stages are served by groups of devices (replicas of a stage) and that split
resources between the passes (Duan-Wu's beta), with the planner's notes, as the dashboard
shows them: the layouts the run page fetches and embeds, the compare page, and the planned
timeline of such a plan (its replicas side by side, their all-reduce drawn)."""

from __future__ import annotations

import itertools
import json
import re
from html import unescape

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    PlanFactory,
    RunFactory,
)
from webapp.dashboard import selectors
from webapp.runs.models import Plan, Run

pytestmark = pytest.mark.django_db

NAMES = {"a": "demo-fast", "b": "demo-slow", "c": "demo-slowlink"}
NOTES = ["beta brings nothing on a device with a single resource, so it runs sequentially"]
# stage 1 replicated on b and c; a's cpu split 0.42 forward, b's too, c runs sequentially
GROUPED = {"algorithm": "duanwu", "schedule": "1f1b", "microbatches": 4,
           "stages": [{"layers": [0, 3], "devices": ["a"]},
                      {"layers": [4, 5], "devices": ["b", "c"]}],
           "beta": {"a": {"cpu": 0.42}, "b": {"gpu": 0.8, "cpu": 0.5}},
           "notes": NOTES}


def test_a_layout_shows_each_stages_group_the_betas_and_the_notes():
    layout = selectors.plan_layout(document=GROUPED, names=NAMES)
    assert layout["algorithm"] == "duanwu" and layout["beta"] is True
    assert layout["summary"] == "2 stages (1 replicated)"
    assert [s["text"] for s in layout["stages"]] == [
        "layers 0–3 on demo-fast", "layers 4–5 on demo-slow + demo-slowlink (2 replicas)"]
    assert [s["replicas"] for s in layout["stages"]] == [1, 2]
    devices = [d for s in layout["stages"] for d in s["devices"]]
    assert [(d["device"], d["label"]) for d in devices] == [
        ("a", "demo-fast"), ("b", "demo-slow"), ("c", "demo-slowlink")]
    # per device and resource (in resource order), the forward pass's share
    assert [d["passes"] for d in devices] == [
        "β cpu 0.42 forward", "β cpu 0.50 forward, β gpu 0.80 forward",
        "forward, then backward (no β)"]
    assert devices[1]["beta"] == [
        {"resource": "cpu", "forward": 0.5, "text": "β cpu 0.50 forward"},
        {"resource": "gpu", "forward": 0.8, "text": "β gpu 0.80 forward"}]
    assert [d["sequential"] for d in devices] == [False, False, True]
    assert layout["notes"] == NOTES


@pytest.mark.parametrize(("document", "summary", "texts", "passes", "notes"), [
    # one stage, one layer, no beta: no pass is described; an unknown device by its uid
    ({"algorithm": "tapp", "stages": [{"layers": [0, 0], "devices": ["x"]}]},
     "1 stage", ["layer 0 on x"], [""], []),
    # every device on one stage; a single note as a string
    ({"algorithm": "bsp", "stages": [{"layers": [0, 5], "devices": ["a", "b", "c"]}],
      "notes": "all three replicate the model"},
     "1 stage (1 replicated)", ["layers 0–5 on demo-fast + demo-slow + demo-slowlink "
                                "(3 replicas)"], ["", "", ""], ["all three replicate the model"]),
    # a foreign document: what is missing is said, not guessed; junk notes are left out
    ({"stages": [{"devices": ["a"]}, "junk", {"layers": [1, 2], "devices": []}],
      "beta": {"a": {"cpu": "half"}}, "notes": [None, " ", "kept"]},
     "2 stages", ["layers ? on demo-fast", "layers 1–2 on no device"],
     ["forward, then backward (no β)"], ["kept"]),
])
def test_a_layout_of_other_plans(document, summary, texts, passes, notes):
    layout = selectors.plan_layout(document=document, names=NAMES)
    assert layout["summary"] == summary
    assert [s["text"] for s in layout["stages"]] == texts
    assert [d["passes"] for s in layout["stages"] for d in s["devices"]] == passes
    assert layout["notes"] == notes


def test_plural():
    assert [selectors.plural(n, "stage") for n in (0, 1, 2)] == ["0 stages", "1 stage",
                                                                 "2 stages"]
    assert selectors.plural(1, "replica", "replicas") == "1 replica"


@pytest.fixture
def grouped_run() -> Run:
    """Three profiled devices, the second replica first in the run's own order; a grouped
    duanwu plan (chosen) and a one-stage tapp plan, both computed; a plan still pending."""
    spec = ModelSpecFactory(dataset="groups")
    devices = {uid: DeviceFactory(uid=uid, name=name) for uid, name in NAMES.items()}
    for k, device in enumerate(devices.values()):
        LayerProfileFactory(device=device, model_spec=spec, layers=6, scale=1.0 + k)
    run = RunFactory(model_spec=spec, devices=[devices["c"], devices["a"], devices["b"]],
                     algorithms=["duanwu", "tapp", "uniform"])
    chosen = PlanFactory(run=run, algorithm="duanwu", document={
        **GROUPED, "beta": {"a": {"cpu": 0.42}, "b": {"cpu": 0.5}, "c": {"cpu": 0.6}}})
    PlanFactory(run=run, algorithm="tapp", stages=1, document={
        "algorithm": "tapp", "stages": [{"layers": [0, 5], "devices": ["a", "b", "c"]}]})
    PlanFactory(run=run, algorithm="uniform", status=Plan.Status.PENDING, document=None)
    Run.objects.filter(pk=run.pk).update(chosen_plan=chosen, state=Run.State.RUNNING)
    run.refresh_from_db()
    return run


def test_the_layouts_api_lists_every_computed_plan(api: APIClient, anon: APIClient,
                                                   grouped_run: Run):
    path = f"/api/dashboard/runs/{grouped_run.pk}/plans/layouts/"
    answer = api.get(path)
    assert answer.status_code == 200
    got = answer.json()
    assert got["run"] == grouped_run.pk
    assert [(x["algorithm"], x["summary"]) for x in got["layouts"]] == [
        ("duanwu", "2 stages (1 replicated)"), ("tapp", "1 stage (1 replicated)")]
    assert got["layouts"][0]["stages"][1]["text"] == (
        "layers 4–5 on demo-slow + demo-slowlink (2 replicas)")
    assert got["layouts"][0]["notes"] == NOTES
    assert api.get("/api/dashboard/runs/999999/plans/layouts/").status_code == 404
    assert anon.get(path).status_code in (401, 403)


def test_the_run_page_embeds_the_layouts_and_the_run_order(browser: Client, grouped_run: Run):
    html = browser.get(f"/runs/{grouped_run.pk}/").content.decode()
    config = json.loads(unescape(re.search(
        r'<script id="run-config" type="application/json">(.*?)</script>', html, re.S)[1]))
    # the run's own order; the page lays its Gantts out by the layouts' stages
    assert [d["device"] for d in config["devices"]] == ["c", "a", "b"]
    assert [x["algorithm"] for x in config["layouts"]] == ["duanwu", "tapp"]
    stages = config["layouts"][0]["stages"]
    assert [[d["device"] for d in s["devices"]] for s in stages] == [["a"], ["b", "c"]]
    assert [d["passes"] for s in stages for d in s["devices"]] == [
        "β cpu 0.42 forward", "β cpu 0.50 forward", "β cpu 0.60 forward"]
    assert config["urls"]["layouts"] == f"/api/dashboard/runs/{grouped_run.pk}/plans/layouts/"


def test_the_compare_page_shows_the_chosen_plans_groups_betas_and_notes(browser: Client,
                                                                       grouped_run: Run):
    other = RunFactory()
    PlanFactory(run=other, algorithm="tapp", stages=1, document={
        "algorithm": "tapp", "stages": [{"layers": [0, 3], "devices": ["x"]}]})
    Run.objects.filter(pk=other.pk).update(chosen_plan=other.plans.get())
    html = browser.get(f"/runs/compare/?runs={grouped_run.pk},{other.pk}").content.decode()
    text = unescape(re.sub(r"<[^>]+>", " ", html))
    words = " ".join(text.split())
    assert "duanwu · 2 stages (1 replicated)" in words
    assert "stage 1 layers 4–5 on demo-slow + demo-slowlink (2 replicas)" in words
    assert "demo-fast: β cpu 0.42 forward" in words
    assert "demo-slowlink: β cpu 0.60 forward" in words
    assert NOTES[0] in words
    assert "tapp · 1 stage" in words and "1 stages" not in words


def test_the_compare_page_shows_names_as_text(browser: Client):
    runs = []
    for _ in range(2):
        device = DeviceFactory(name="<b>bold</b>")
        run = RunFactory(devices=[device])
        plan = PlanFactory(run=run, stages=1, document={
            "algorithm": "ftpipehd", "stages": [{"layers": [0, 3], "devices": [device.uid]}],
            "notes": ["<i>note</i>"]})
        Run.objects.filter(pk=run.pk).update(chosen_plan=plan)
        runs.append(run)
    html = browser.get(f"/runs/compare/?runs={runs[0].pk},{runs[1].pk}").content.decode()
    assert "<b>bold</b>" not in html and "<i>note</i>" not in html
    assert "layers 0–3 on &lt;b&gt;bold&lt;/b&gt;" in html
    assert "&lt;i&gt;note&lt;/i&gt;" in html


def test_a_grouped_plans_planned_timeline(api: APIClient, grouped_run: Run):
    """The rows are the stages' devices in pipeline order, replicas side by side, and the
    replicas share their gradients (the plan's notes are the planner's words for people)."""
    plan = grouped_run.chosen_plan
    answer = api.get(f"/api/dashboard/runs/{grouped_run.pk}/plans/{plan.pk}/timeline/")
    assert answer.status_code == 200, answer.json()
    got = answer.json()
    assert [(r["device"], r["label"], r["stage"]) for r in got["rows"]] == [
        ("a", "demo-fast", 0), ("b", "demo-slow", 1), ("c", "demo-slowlink", 1)]
    aggregated = {e["device"] for e in got["events"] if e["kind"] == "aggregate"}
    assert aggregated == {"b", "c"}
    ghosts = api.get(f"/api/dashboard/runs/{grouped_run.pk}/planned/?start=0&end=5")
    assert ghosts.status_code == 200 and ghosts.json()["events"]


def test_a_plan_whose_beta_leaves_a_device_out_is_simulated(api: APIClient,
                                                              grouped_run: Run) -> None:
    """A device absent from a plan's beta runs its passes one after the other; the device
    with a split runs them at once, on two lanes (its forward and backward bars overlap)."""
    plan = grouped_run.chosen_plan
    Plan.objects.filter(pk=plan.pk).update(document={**GROUPED, "beta": {"a": {"cpu": 0.5}}})
    answer = api.get(f"/api/dashboard/runs/{grouped_run.pk}/plans/{plan.pk}/timeline/")
    assert answer.status_code == 200, answer.json()
    events = answer.json()["events"]

    def overlaps(device: str) -> bool:
        passes = sorted((e["start"], e["end"]) for e in events
                        if e["device"] == device and e["kind"] in ("forward", "backward"))
        return any(b[0] < a[1] - 1e-9 for a, b in itertools.pairwise(passes))

    assert overlaps("a") and not overlaps("b")
