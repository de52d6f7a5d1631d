"""bench/aggregation.py: real pipelines of stage executors trained with and without FTPipeHD's
weight aggregation, and the held-out accuracy of the composed models."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

from agent.data import load_dataset
from bench.aggregation import main, train


@pytest.fixture(autouse=True)
def _torch_threads() -> Iterator[None]:
    # each stage's thread sets torch's threads to one: give the suite back its own
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_tiny_run_reports_every_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    # Execute: one seed, 24 micro-batches a run, aggregation off and every 1 and 2
    assert main(["--seeds", "1", "--microbatches", "24", "--every", "2,1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()

    # Assert: a table row per configuration, and a last JSON line with every figure
    summary = json.loads(out[-1])
    assert summary["bench"] == "aggregation" and summary["microbatches"] == 24
    assert [c["config"] for c in summary["configs"]] == ["off", "every 1", "every 2"]
    for config in summary["configs"]:
        assert any(line.startswith(config["config"]) for line in out[:-1])
        assert 0 <= config["accuracy_min"] <= config["accuracy_mean"] <= config[
            "accuracy_max"] <= 1
    runs = summary["runs"]
    assert sorted(r["aggregate_every"] for r in runs) == [0, 1, 2]
    assert all(0 <= r["accuracy"] <= 1 and r["wall_s"] > 0 for r in runs)
    # four stages keep 4, 3, 2, 1 versions: every 1 averages the first three stages every
    # 4, 3 and 2 updates of 24; the last (one version) never does
    assert {r["aggregate_every"]: r["aggregations"] for r in runs} == {
        0: [0, 0, 0, 0], 1: [6, 8, 12, 0], 2: [3, 4, 6, 0]}


def test_aggregation_changes_what_is_trained() -> None:
    # Prepare: the same seed trained twice without aggregation and once with it
    digits = load_dataset("digits")

    def weights(aggregate_every: int) -> list[torch.Tensor]:
        run = train(digits, microbatches=30, seed=1, aggregate_every=aggregate_every)
        return [p.detach().clone() for p in run.model.parameters()]

    # Execute
    plain, again, aggregated = weights(0), weights(0), weights(2)

    # Assert: training is deterministic, so the bench's difference is aggregation's alone
    assert all(torch.equal(a, b) for a, b in zip(plain, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(plain, aggregated, strict=True))
