"""``python -m orchestrator sl``: good runs, Gantt output, checks and exit code 2 on bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.sl import cli as sl_cli
from orchestrator.sl.check import first_violation
from orchestrator.sl.formats import Schedule, load_instance, parse_schedule

ROOT = Path(__file__).resolve().parents[3]


def _write(tmp_path: Path, name: str, document: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_register_adds_a_parser_with_a_handler(capsys: pytest.CaptureFixture[str],
                                               data_dir: Path) -> None:
    parser = argparse.ArgumentParser()
    sl_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sl", "--instance", str(data_dir / "resnet101_mnist.jsonl"),
                              "--name", "resnet101-mnist-K10-H2-s1-slots100",
                              "--method", "random-fcfs", "--seed", "3"])
    assert args.handler(args) == 0
    schedule = parse_schedule(json.loads(capsys.readouterr().out))
    assert (schedule.method, schedule.seed) == ("random-fcfs", 3)


def test_good_run_prints_a_feasible_schedule(capsys: pytest.CaptureFixture[str],
                                             data_dir: Path) -> None:
    path = data_dir / "resnet101_cifar10.jsonl"
    code = main(["sl", "--instance", str(path), "--index", "2", "--method", "auto",
                 "--time-limit", "2"])
    assert code == 0
    schedule = parse_schedule(json.loads(capsys.readouterr().out))
    instance = load_instance(path, index=2)
    assert schedule.instance == instance.name == "resnet101-cifar10-K10-H2-s1-slots100"
    assert first_violation(instance=instance, schedule=schedule) is None
    assert schedule.lower_bound is not None and schedule.lower_bound <= schedule.makespan


def test_gantt_draws_every_helper_and_client(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path, tiny_json: dict[str, Any]) -> None:
    path = _write(tmp_path, "tiny.json", tiny_json)
    assert main(["sl", "--instance", str(path), "--method", "exact", "--gantt"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny: exact, makespan ")
    assert "helper 0:" in out and "helper 1:" in out
    rows = [line for line in out.splitlines() if line.strip().startswith("client ")]
    assert len(rows) == 2 and all(">" in r and "<" in r and "|" in r for r in rows)


def test_switch_slots_option_reaches_the_schedule(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path,
                                                  tiny_json: dict[str, Any]) -> None:
    path = _write(tmp_path, "tiny.json", tiny_json)
    assert main(["sl", "--instance", str(path), "--method", "auto", "--switch-slots", "2,1"]) == 0
    assert json.loads(capsys.readouterr().out)["switch_slots"] == [2, 1]


def test_bad_instance_exits_2_naming_file_and_field(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path,
                                                    tiny_json: dict[str, Any]) -> None:
    tiny_json["p"][1][1] = 0
    path = _write(tmp_path, "bad.json", tiny_json)
    assert main(["sl", "--instance", str(path), "--method", "auto"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}: p[1][1]: must be at least 1 (got 0)\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["--method", "fastest"], "unknown method 'fastest' (known: exact, admm, balanced-greedy, "
                              "random-fcfs, auto)"),
    (["--method", "auto", "--time-limit", "0"], "the time limit must be positive, got 0.0"),
    (["--method", "auto", "--switch-slots", "1,x"], "--switch-slots must be integers"),
    (["--method", "auto", "--switch-slots", "1,2,3"], "switch_slots needs one value per helper"),
    ([], "--method is required"),
])
def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                            tiny_json: dict[str, Any], argv: list[str], message: str) -> None:
    path = _write(tmp_path, "tiny.json", tiny_json)
    assert main(["sl", "--instance", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "absent.jsonl"
    assert main(["sl", "--instance", str(path), "--method", "auto"]) == 2
    assert capsys.readouterr().err == f"error: {path}: no such file\n"


def test_jsonl_without_a_pick_exits_2(capsys: pytest.CaptureFixture[str],
                                      data_dir: Path) -> None:
    path = data_dir / "resnet101_cifar10.jsonl"
    assert main(["sl", "--instance", str(path), "--method", "auto"]) == 2
    assert "holds 36 instances; pick one with --index N (0..35) or --name NAME" in \
        capsys.readouterr().err


def test_check_explains_an_infeasible_schedule(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, tiny_json: dict[str, Any],
                                               tiny_schedule: Schedule) -> None:
    instance = _write(tmp_path, "tiny.json", tiny_json)
    good = _write(tmp_path, "good.json", tiny_schedule.to_json())
    bad = _write(tmp_path, "bad.json", replace(tiny_schedule, makespan=3).to_json())
    assert main(["sl", "--instance", str(instance), "--check", str(good)]) == 0
    assert capsys.readouterr().out == "feasible: makespan 9 slots\n"
    assert main(["sl", "--instance", str(instance), "--check", str(bad)]) == 1
    assert capsys.readouterr().out == ("infeasible: the makespan is 9 (client 1 completes last) "
                                       "but the schedule says 3\n")


def test_help_lists_the_methods(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sl", "--help"])
    out = capsys.readouterr().out
    for method in ("exact", "admm", "balanced-greedy", "random-fcfs", "auto", "--gantt",
                   "--index", "--name", "--switch-slots"):
        assert method in out


def test_python_dash_m_entry_point(data_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "sl", "--instance",
         str(data_dir / "resnet101_mnist.jsonl"), "--index", "0", "--method", "balanced-greedy"],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["method"] == "balanced-greedy"
