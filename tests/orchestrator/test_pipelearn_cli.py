"""``python -m orchestrator pipelearn`` end to end, its one-line errors, and the planned timeline:
valid events whose iteration respects the stage DAG's precedence."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.events import busy_intervals, parse_event
from orchestrator.formats import load_devices, load_profile
from orchestrator.pipelearn import Node, dag_edges
from orchestrator.pipelearn_plan import compare, make_setting
from orchestrator.pipelearn_timeline import timeline
from tests.conftest import DATA, ROOT

VGG = [str(DATA / "profiles" / "vgg5_cifar10.model.json"),
       str(DATA / "profiles" / "vgg5_cifar10.devices.json")]
CLIENTS = {"m1-laptop", "rpi4", "jetson-cpu", "jetson-gpu"}


def args(*extra: str, profile: str = VGG[0], devices: str = VGG[1]) -> list[str]:
    return ["pipelearn", "--profile", profile, "--devices", devices, "--server", "edge-vm",
            *extra]


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else out, err


def test_good_run_in_a_subprocess() -> None:
    result = subprocess.run([sys.executable, "-m", "orchestrator", *args()], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert set(document["devices"]) == CLIENTS
    for plan in document["devices"].values():
        assert 1 <= plan["split"] <= 4 and 1 <= plan["parallel_batches"] <= 100
        assert plan["minibatch"] == 100 // plan["parallel_batches"]
        assert plan["epoch_s"] > 0 and set(plan["idle_s"]) == {"device", "server"}
        assert plan["network_bps"] > 0
    assert document["fl"]["epoch_s"] > document["epoch_s"]
    assert document["sfl"]["epoch_s"] > document["epoch_s"]
    assert document["speedup"]["fl"] == pytest.approx(
        document["fl"]["epoch_s"] / document["epoch_s"])
    assert all(p["split"] == 5 for p in document["fl"]["devices"].values())


def test_options_change_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, small, _ = run_main(args("--batch-size", "20", "--data-size", "400"), capsys)
    assert code == 0
    assert (small["batch_size"], small["iterations"]) == (20, 20)
    assert all(p["parallel_batches"] <= 20 for p in small["devices"].values())
    code, lanes, _ = run_main(args("--server-parallelism", "4"), capsys)
    assert code == 0 and lanes["server_slowdown"] == 1.0
    code, paper, _ = run_main(args("--rule", "eq14"), capsys)
    assert code == 0 and paper["rule"] == "eq14"


def test_exhaustive_reports_the_closed_form_score(capsys: pytest.CaptureFixture[str]) -> None:
    code, document, _ = run_main(args("--exhaustive"), capsys)
    assert code == 0 and document["exhaustive"] is True
    for plan in document["devices"].values():
        choice = plan["closed_form"]
        assert 0.98 <= choice["score"] <= 1.0
        assert choice["score"] == pytest.approx(plan["iteration_s"] / choice["iteration_s"])


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["devices"][2].update(uplink_bps=-1),
     "bad.json: devices[2].uplink_bps: must not be negative (got -1)"),
    (lambda d: d["devices"][1]["layer_times"]["forward_s"].pop(),
     "bad.json: devices[1].layer_times.backward_s: has 5 entries but forward_s has 4"),
    (lambda d: d["devices"][3].update(uplink=1),
     "bad.json: devices[3].uplink: is not a known field"),
])
def test_bad_devices_exit_2_with_one_line(change: Any, expected: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads(Path(VGG[1]).read_text())
    change(document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    code, out, err = run_main(args(devices=str(bad)), capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error: ") and str(bad) in err and expected.split(": ", 1)[1] in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--server", "nope"], "--server 'nope' is not a device of"),
])
def test_bad_server_exits_2(argv: list[str], message: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["pipelearn", "--profile", VGG[0], "--devices", VGG[1], *argv],
                            capsys)
    assert code == 2 and err.count("\n") == 1 and message in err and VGG[1] in err


def test_profile_of_other_length_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    resnet18 = str(DATA / "profiles" / "resnet18_cifar10.model.json")
    code, _, err = run_main(args(profile=resnet18), capsys)
    assert code == 2 and err.count("\n") == 1
    assert "devices[0].layer_times.forward_s: has 5 entries but the profile 'resnet18'" in err


# --------------------------------------------------------------------------- timeline


def node_intervals(events: list[Any], plan: Any, replica: int,
                   iteration: int) -> dict[Node, tuple[float, float]]:
    """The stage of each event of one client's iteration, read back from the rows (the model
    transfers of the aggregation come after the last iteration and are left out)."""
    device, n = plan.device, plan.parallel_batches
    kinds = {(device, 0, "forward"): "device_forward", (device, 0, "send"): "upload",
             ("edge-vm", replica, "forward"): "server_forward",
             ("edge-vm", replica, "backward"): "server_backward",
             ("edge-vm", replica, "send"): "download", (device, 0, "backward"): "device_backward"}
    out: dict[Node, tuple[float, float]] = {}
    for e in events:
        stage = kinds.get((e.device, e.stage, e.kind))
        if stage and e.version == iteration and e.start < ITERATIONS * plan.iteration_s:
            out[(stage, e.microbatch - iteration * n)] = (e.start, e.end)
    return out


ITERATIONS = 2


@pytest.mark.parametrize("method", ["pipelearn", "sfl"])
def test_timeline_events_are_valid_and_respect_the_dag(method: str) -> None:
    setting = make_setting(profile=load_profile(VGG[0]), devices=load_devices(VGG[1]),
                           server="edge-vm", data_size=300)
    result = compare(setting)
    plan = result.pipelearn if method == "pipelearn" else result.sfl
    events = [parse_event(e.to_json(), path=f"events[{i}]")
              for i, e in enumerate(timeline(method=plan, iterations=ITERATIONS, run=3))]
    assert {e.run for e in events} == {3}
    assert {e.kind for e in events} == {"forward", "backward", "send", "recv", "aggregate"}
    rows: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for e in events:
        rows[(e.device, e.stage)].append(e)
    for k, p in enumerate(plan.devices):
        for iteration in range(ITERATIONS):
            got = node_intervals(events, p, 1 + k, iteration)
            assert len(got) == 6 * p.parallel_batches
            for edge in dag_edges(stages=p.stages, parallel_batches=p.parallel_batches):
                assert got[edge.after][0] >= got[edge.before][1] + edge.delay_s - 1e-9, edge
        for row in ((p.device, 0), ("edge-vm", 1 + k)):  # one pass at a time on a row
            compute = sorted((e.start, e.end) for e in rows[row]
                             if e.kind in ("forward", "backward"))
            assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(compute))
            assert sum(end - start for start, end in busy_intervals(rows[row])) == pytest.approx(
                sum(end - start for start, end in compute))
    aggregate = next(e for e in events if e.kind == "aggregate")
    models = [e for e in events if e.kind == "recv" and e.stage > 0
              and e.start >= ITERATIONS * plan.devices[e.stage - 1].iteration_s]
    assert len(models) == 4 and aggregate.start == pytest.approx(max(e.end for e in models))


@pytest.mark.parametrize("method", ["pipelearn", "fl"])
def test_timeline_option(method: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, document, _ = run_main(args("--timeline", "--timeline-method", method,
                                      "--iterations", "1"), capsys)
    assert code == 0
    events = [parse_event(e) for e in document["events"]]
    on_server = {e.kind for e in events if e.device == "edge-vm"}
    if method == "fl":  # the whole model on the clients: the server only aggregates
        assert on_server == {"recv", "send", "aggregate"}
        assert sum(e.kind == "forward" for e in events) == len(CLIENTS)
    else:
        assert on_server == {"recv", "send", "forward", "backward", "aggregate"}
        assert sum(e.kind == "forward" and e.device in CLIENTS for e in events) == sum(
            p["parallel_batches"] for p in document["devices"].values())
