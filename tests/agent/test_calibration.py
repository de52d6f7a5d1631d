"""The agent's fixed-cost probe, kept between starts (agent.calibration): reused only under the
same key, a file that is not one of its own refused with a log line and measured again."""

from __future__ import annotations

import json
import logging
import pickle
import socket
from pathlib import Path

import pytest
import torch

from agent import calibration
from agent.calibration import Calibration, FixedCosts, fixed_costs, load_kept, probe_key
from agent.cli import wait_for_server


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The probe's two measurements replaced by counted stand-ins (0.5 ms and 0.1 ms)."""
    calls: list[str] = []

    def overhead(*, slowdown: float = 1.0) -> float:
        calls.append(f"overhead {slowdown:g}")
        return 0.0005

    def message() -> float:
        calls.append("message")
        return 0.0001

    monkeypatch.setattr("agent.profiler.measure_overhead", overhead)
    monkeypatch.setattr("agent.profiler.measure_message_cost", message)
    return calls


def key_now() -> dict[str, object]:
    """The key of a probe at slowdown 1 with torch's threads (the tests set none)."""
    return probe_key(slowdown=1.0, threads=torch.get_num_threads())


def test_the_key_changes_with_each_thing_the_figures_depend_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = probe_key(slowdown=1.0, threads=1)
    assert probe_key(slowdown=1.0, threads=1) == base
    assert probe_key(slowdown=4.0, threads=1) != base
    assert probe_key(slowdown=1.0, threads=2) != base
    monkeypatch.setattr(socket, "gethostname", lambda: "another-host")
    assert probe_key(slowdown=1.0, threads=1) != base
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert probe_key(slowdown=1.0, threads=1) != base
    monkeypatch.undo()
    monkeypatch.setattr(calibration, "PROBE_VERSION", calibration.PROBE_VERSION + 1)
    assert probe_key(slowdown=1.0, threads=1) != base


def test_a_restart_reuses_the_kept_probe_and_another_key_measures_again(
        tmp_path: Path, probes: list[str], caplog: pytest.LogCaptureFixture) -> None:
    # Prepare
    path = tmp_path / "agent.fixed-costs.json"
    # Execute: a first start measures and keeps; a second reuses
    first = fixed_costs(path=path, slowdown=1.0, threads=None)
    second = fixed_costs(path=path, slowdown=1.0, threads=None)
    # Assert
    assert first == second == FixedCosts(overhead_s=0.0005, message_s=0.0001)
    assert probes == ["overhead 1", "message"]
    kept = json.loads(path.read_text())
    assert kept["key"] == key_now() and kept["overhead_s"] == 0.0005
    # Execute: another slowdown is another key: measured again, said, and kept instead
    with caplog.at_level(logging.INFO, logger="edgepipe.agent"):
        fixed_costs(path=path, slowdown=4.0, threads=None)
    # Assert
    assert probes == ["overhead 1", "message", "overhead 4", "message"]
    assert "was measured with another slowdown; measuring again" in caplog.text
    assert json.loads(path.read_text())["key"]["slowdown"] == 4.0


@pytest.mark.parametrize("content", [
    b"{not json",
    pickle.dumps({"key": {}, "overhead_s": 0.0005, "message_s": 0.0001}),
    json.dumps([1, 2]).encode(),
    json.dumps({"overhead_s": 0.0005, "message_s": 0.0001}).encode(),
    "KEY_PLACEHOLDER",
])
def test_a_corrupt_or_foreign_file_is_refused_with_a_log_line_and_measured_again(
        tmp_path: Path, probes: list[str], caplog: pytest.LogCaptureFixture,
        content: bytes | str) -> None:
    # Prepare: the right key, but not figures this probe could have written
    path = tmp_path / "agent.fixed-costs.json"
    if content == "KEY_PLACEHOLDER":
        content = json.dumps({"key": key_now(),
                              "overhead_s": True, "message_s": -1}).encode()
    assert isinstance(content, bytes)
    path.write_bytes(content)
    # Execute
    with caplog.at_level(logging.WARNING, logger="edgepipe.agent"):
        costs = fixed_costs(path=path, slowdown=1.0, threads=None)
    # Assert: measured, said, and the file replaced by one that is read back
    assert probes == ["overhead 1", "message"]
    assert costs == FixedCosts(overhead_s=0.0005, message_s=0.0001)
    assert f"{path}: not a kept fixed-cost probe" in caplog.text
    assert load_kept(path, key_now()) == costs


def test_kept_figures_out_of_range_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.fixed-costs.json"
    key = probe_key(slowdown=1.0, threads=1)
    path.write_text(json.dumps({"key": key, "overhead_s": 11.0, "message_s": 0.0}))
    assert load_kept(path, key) is None
    path.write_text(json.dumps({"key": key, "overhead_s": 0.001, "message_s": "0.1"}))
    assert load_kept(path, key) is None
    assert load_kept(tmp_path / "none.json", key) is None


def test_the_probe_runs_on_its_own_thread_and_hands_over_its_result_or_error(
        tmp_path: Path, probes: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert Calibration(path=None, slowdown=1.0, threads=None).result() == FixedCosts(0.0005, 0.0001)

    def broken(**kwargs: object) -> FixedCosts:
        raise RuntimeError("no probe")

    monkeypatch.setattr(calibration, "fixed_costs", broken)
    with pytest.raises(RuntimeError, match="no probe"):
        Calibration(path=tmp_path / "x.json", slowdown=1.0, threads=None).result()


def test_waiting_for_a_server_that_starts_beside_the_agent() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert wait_for_server(f"http://127.0.0.1:{port}", wait_s=5.0)
    # nobody listens there any more: it gives up after wait_s
    assert not wait_for_server(f"http://127.0.0.1:{port}", wait_s=0.3)
