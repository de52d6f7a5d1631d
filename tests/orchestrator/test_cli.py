"""``python -m orchestrator``: each subcommand end to end in a subprocess, and the one-line
errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, ROOT

PROFILE = str(DATA / "profiles" / "resnet101_cifar10.model.json")
DEVICES = str(DATA / "profiles" / "resnet101_cifar10.devices.json")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_plan_then_simulate(tmp_path: Path) -> None:
    planned = run("plan", "--profile", PROFILE, "--devices", DEVICES, "--algorithm", "optimal",
                  "--microbatches", "4")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["algorithm"] == "optimal" and plan["bound"]["exact"] is True
    assert plan["predicted"]["memory_ok"] is True
    path = tmp_path / "plan.json"
    path.write_text(planned.stdout)
    simulated = run("simulate", "--profile", PROFILE, "--devices", DEVICES, "--plan", str(path),
                    "--microbatches", "6")
    assert simulated.returncode == 0, simulated.stderr
    document = json.loads(simulated.stdout)
    assert document["summary"]["microbatches"] == 6
    kinds = {e["kind"] for e in document["events"]}
    assert {"forward", "backward", "send", "recv"} <= kinds
    table = run("simulate", "--profile", PROFILE, "--devices", DEVICES, "--plan", str(path),
                "--microbatches", "3", "--actions")
    assert table.stdout.splitlines()[1].split()[1] == "0F0"


def test_compare_table_and_json() -> None:
    table = run("compare", "--profile", PROFILE, "--devices", DEVICES)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["algorithm", "stages", "period_s", "samples/s"]
    optimal = next(line for line in lines if line.startswith("optimal"))
    assert "1.00x" in optimal
    as_json = run("compare", "--profile", PROFILE, "--devices", DEVICES, "--json",
                  "--algorithms", "uniform,optimal")
    rows = json.loads(as_json.stdout)["rows"]
    assert [r["algorithm"] for r in rows] == ["uniform", "optimal"]
    assert rows[1]["period_s"] <= rows[0]["period_s"]


def test_group() -> None:
    result = run("group", "--profile", PROFILE, "--devices", DEVICES, "--workers", "3",
                 "--algorithm", "brute-force")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert sorted(d for g in document["groups"] for d in g) == sorted(
        ["edge-vm", "m1-laptop", "rpi4", "jetson-cpu", "jetson-gpu"])
    local = json.loads(run("group", "--profile", PROFILE, "--devices", DEVICES,
                           "--workers", "3").stdout)
    assert local["period_s"] >= document["period_s"] * (1 - 1e-9)


@pytest.mark.parametrize(("args", "message"), [
    (["plan", "--profile", "missing.json", "--devices", DEVICES, "--algorithm", "uniform"],
     "error: missing.json: no such file"),
    (["plan", "--profile", DEVICES, "--devices", DEVICES, "--algorithm", "uniform"],
     "is missing"),
    (["compare", "--profile", PROFILE, "--devices", DEVICES, "--algorithms", "uniform,zz"],
     "error: --algorithms: unknown algorithm 'zz'"),
    (["group", "--profile", PROFILE, "--devices", DEVICES, "--workers", "9"],
     "error: --workers must be at most 5"),
    (["plan", "--profile", PROFILE, "--devices", DEVICES, "--algorithm", "optimal",
      "--workers", "2"], "error: --workers applies to --algorithm duanwu only"),
])
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_no_plan_fits_in_memory_exits_2(tmp_path: Path) -> None:
    devices = json.loads(Path(DEVICES).read_text())
    for device in devices["devices"]:
        device["memory_bytes"] = 1000
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(devices))
    result = run("plan", "--profile", PROFILE, "--devices", str(path), "--algorithm", "optimal")
    assert result.returncode == 2
    assert "fits in their memory" in result.stderr
    result = run("plan", "--profile", PROFILE, "--devices", str(path), "--algorithm", "uniform")
    assert result.returncode == 2
    assert "the uniform plan does not fit in memory: device" in result.stderr


def test_bad_plan_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"algorithm": "x", "stages": [
        {"layers": [0, 10], "devices": ["edge-vm"]}, {"layers": [12, 36], "devices": ["rpi4"]}]}))
    result = run("simulate", "--profile", PROFILE, "--devices", DEVICES, "--plan", str(path),
                 "--microbatches", "2")
    assert result.returncode == 2
    assert f"{path}: stages[1].layers: skips layers 11..11" in result.stderr


@pytest.mark.parametrize("command", ["plan", "simulate", "compare", "group"])
def test_every_subcommand_has_help(command: str) -> None:
    result = run(command, "--help")
    assert result.returncode == 0 and "--profile" in result.stdout
