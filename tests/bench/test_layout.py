"""bench/layout.py: each convolutional zoo model timed in both memory formats."""

from __future__ import annotations

import json

import pytest

from bench.layout import main


def test_it_prints_a_table_and_a_json_line_of_both_layouts(capsys: pytest.CaptureFixture[str]):
    assert main(["--models", "vgg5", "--datasets", "digits", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:2] == ["model", "data"]
    [row] = json.loads(lines[-1])["rows"]
    assert row["model"] == "vgg5" and row["dataset"] == "digits"
    assert row["nchw_ms"] > 0 and row["channels_last_ms"] > 0
    assert row["ratio"] == pytest.approx(row["channels_last_ms"] / row["nchw_ms"])
    assert row["picked"] in ("contiguous", "channels_last")


@pytest.mark.parametrize(("argv", "says"), [
    (["--models", "mlp"], "--models: mlp is not one of"),
    (["--datasets", "npz:x"], "--datasets: npz:x is not one of"),
    (["--rounds", "0"], "--rounds must be at least 1"),
])
def test_bad_options_are_refused(argv: list[str], says: str):
    with pytest.raises(SystemExit, match=says):
        main(argv)
