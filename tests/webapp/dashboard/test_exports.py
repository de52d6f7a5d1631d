"""A run's downloads: the timeline as a Chrome trace (what Perfetto opens), the metrics as CSV,
the plan as plan JSON."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from itertools import pairwise

import pytest
from django.test import Client

from orchestrator.planformat import parse_plan
from tests.webapp.factories import RunFactory
from webapp.runs.models import Run
from webapp.runs.selectors import run_planning_inputs

pytestmark = pytest.mark.django_db


def body(answer) -> bytes:
    return b"".join(answer.streaming_content) if answer.streaming else answer.content


def test_the_trace_is_chrome_trace_json_with_one_process_per_device(browser: Client, reported):
    answer = browser.get(f"/runs/{reported.pk}/export/trace.json")
    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    assert answer["Content-Disposition"] == (
        f'attachment; filename="edgepipe-run-{reported.pk}-trace.json"')
    trace = json.loads(body(answer))
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    devices = [rd.device for rd in reported.run_devices.all()]
    # one process per device in pipeline order, and the run's own for run-wide points
    assert names == {0: f"run {reported.pk}: {reported.name}",
                     **{k + 1: f"{d.name} ({d.uid})" for k, d in enumerate(devices)}}
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 3 * 5 * 4
    first = min(complete, key=lambda e: (e["pid"], e["ts"]))
    assert first == {"name": "forward 0", "cat": "forward", "ph": "X", "ts": 0.0,
                     "dur": 200000.0, "pid": 1, "tid": 100,
                     "args": {"stage": 0, "microbatch": 0, "version": 0, "bytes": 0}}
    # no two events of one thread overlap (Perfetto needs them nested or apart)
    by_thread = defaultdict(list)
    for e in complete:
        by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in pairwise(spans))
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    assert {threads[(1, t)] for t in (100, 200, 300, 301)} == {
        "forward", "backward", "send", "send (2)"}
    assert set(by_thread) == set(threads)
    lost = next(e for e in events if e["ph"] == "i")
    assert lost["name"] == "device_lost" and lost["pid"] == 3 and lost["ts"] == 2_500_000.0
    counters = {(e["pid"], e["name"]) for e in events if e["ph"] == "C"}
    assert counters == {(0, "throughput_sps"), (0, "loss"), (1, "network_bps"),
                        (2, "network_bps"), (3, "network_bps")}


def test_the_trace_of_a_run_with_no_events_is_still_valid(browser: Client):
    run = RunFactory()
    trace = json.loads(body(browser.get(f"/runs/{run.pk}/export/trace.json")))
    assert [e["ph"] for e in trace["traceEvents"]] == ["M", "M", "M", "M"]  # names, order


def test_the_metrics_are_csv_in_time_order(browser: Client, reported):
    answer = browser.get(f"/runs/{reported.pk}/export/metrics.csv")
    assert answer["Content-Type"] == "text/csv; charset=utf-8"
    rows = list(csv.reader(io.StringIO(body(answer).decode())))
    devices = [rd.device.uid for rd in reported.run_devices.all()]
    assert rows == [["at_s", "kind", "device", "value"],
                    ["4.0", "loss", "", "1.75"], ["4.0", "throughput_sps", "", "120.5"],
                    ["5.0", "network_bps", devices[0], "1000000.0"],
                    ["6.0", "network_bps", devices[1], "2000000.0"],
                    ["7.0", "network_bps", devices[2], "3000000.0"]]


def test_the_plan_is_plan_json_the_orchestrator_reads(browser: Client, gpipe_run):
    answer = browser.get(f"/runs/{gpipe_run.pk}/export/plan.json")
    assert answer.status_code == 200
    best = gpipe_run.plans.order_by("period_s").first()
    assert answer["Content-Disposition"].endswith(
        f'-plan-{best.algorithm}.json"')
    profile, devices = run_planning_inputs(run=gpipe_run)
    plan = parse_plan(json.loads(answer.content), profile=profile, devices=devices)
    assert plan.algorithm == best.algorithm
    other = gpipe_run.plans.exclude(pk=best.pk).get()
    answer = browser.get(f"/runs/{gpipe_run.pk}/export/plan.json?plan={other.pk}")
    assert json.loads(answer.content)["algorithm"] == other.algorithm


def test_after_a_re_partition_the_plan_downloaded_is_the_one_trained_now(browser: Client,
                                                                          gpipe_run):
    # the export kept the cuts the run started with after a re-partition moved them
    started = gpipe_run.plans.order_by("period_s").first()
    moved = {**started.document, "algorithm": "ftpipehd",
             "stages": list(reversed(started.document["stages"]))}
    Run.objects.filter(pk=gpipe_run.pk).update(
        chosen_plan=started, generation=2, deployment={"plan": moved, "since_s": 12.0})
    answer = browser.get(f"/runs/{gpipe_run.pk}/export/plan.json")
    assert answer.status_code == 200
    assert answer["Content-Disposition"].endswith('-plan-generation-2.json"')
    assert json.loads(answer.content)["stages"] == moved["stages"]
    # a plan asked for by id is still that plan
    answer = browser.get(f"/runs/{gpipe_run.pk}/export/plan.json?plan={started.pk}")
    assert json.loads(answer.content)["stages"] == started.document["stages"]


def test_a_run_without_a_plan_has_no_plan_to_download(browser: Client):
    run = RunFactory()
    answer = browser.get(f"/runs/{run.pk}/export/plan.json")
    assert answer.status_code == 404
    assert f"run {run.pk} has no computed plan yet" in answer.content.decode()


def test_the_planning_inputs_replan_to_the_same_plan_from_the_command_line(
        browser: Client, gpipe_run, tmp_path) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    paths = {}
    for part in ("model", "devices"):
        answer = browser.get(f"/runs/{gpipe_run.pk}/export/{part}.json")
        assert answer.status_code == 200
        assert answer["Content-Disposition"].endswith(f'-{gpipe_run.pk}.{part}.json"')
        paths[part] = tmp_path / f"{part}.json"
        paths[part].write_bytes(answer.content)
    best = gpipe_run.plans.order_by("period_s").first()
    planned = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", "--profile", str(paths["model"]),
         "--devices", str(paths["devices"]), "--algorithm", best.algorithm,
         "--schedule", "gpipe", "--microbatches", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["predicted"]["period_s"] == pytest.approx(best.period_s)
    assert [s["layers"] for s in plan["stages"]] == [
        s["layers"] for s in best.document["stages"]]


def test_a_run_that_cannot_be_planned_has_no_inputs_to_download(browser: Client):
    run = RunFactory()  # its devices have no profile of its model
    answer = browser.get(f"/runs/{run.pk}/export/model.json")
    assert answer.status_code == 404
    assert f"run {run.pk} cannot be planned yet" in answer.content.decode()


def test_downloads_need_a_login(client: Client, reported):
    for name in ("trace.json", "metrics.csv", "plan.json", "model.json", "devices.json"):
        assert client.get(f"/runs/{reported.pk}/export/{name}").status_code == 302
