"""bench/ingest.py: both forms of an events batch carry the same events and points, and the bench
prints a row for each and one JSON line."""

from __future__ import annotations

import json

import pytest

from bench.ingest import FORMS, encode, ingest, main, workload


def test_both_forms_read_back_as_the_same_events_and_points() -> None:
    timeline, metrics = workload(40, 10)
    read = {form: ingest(encode(form, timeline, metrics)) for form in FORMS}
    assert read["objects"] == read["columns"]
    assert read["columns"][0] == timeline
    assert [(p["at"], p["kind"], p["device"], p["value"]) for p in read["columns"][1]] == metrics
    assert len(encode("columns", timeline, metrics)) < len(encode("objects", timeline, metrics))


def test_the_bench_prints_a_row_per_form_and_a_json_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--events", "20", "--points", "4", "--batches", "3", "--repeats", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(lines[-1])
    assert figures["bench"] == "ingest" and set(figures["forms"]) == set(FORMS)
    for form in FORMS:
        assert figures["forms"][form]["agent"]["median_us"] > 0
        assert figures["forms"][form]["server"]["min_us"] > 0
        assert any(line.startswith(form) for line in lines[:-1])


def test_bad_arguments_are_refused_with_a_message() -> None:
    with pytest.raises(SystemExit, match="at least 1"):
        main(["--events", "0"])
