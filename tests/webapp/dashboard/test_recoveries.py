"""Fault events grouped into recoveries (webapp.runs.summaries.fault_recoveries, what the run
page's "Faults and recoveries" panel shows) and the run summary's fault figures, from
hand-built events."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp.factories import DeviceFactory, RunFactory
from webapp.runs.models import FaultEvent, TimelineEvent
from webapp.runs.summaries import fault_recoveries, run_summary


def fault(at: float, kind: str, device: str | None = None, **detail: Any) -> dict[str, Any]:
    return {"run": 1, "at": at, "kind": kind, "device": device, "detail": detail}


STAGES_3 = [{"devices": ["a"], "layers": [0, 2]}, {"devices": ["b"], "layers": [3, 5]},
            {"devices": ["c"], "layers": [6, 8]}]
STAGES_2 = [{"devices": ["a"], "layers": [0, 4]}, {"devices": ["c"], "layers": [5, 8]}]


def one_recovery() -> list[dict[str, Any]]:
    """Device b killed at 10 s; the run recovers on a and c, resuming at micro-batch 48."""
    return [
        fault(0.0, "run_started", plan=3),
        fault(10.0, "device_lost", "b", reason="control connection closed",
              detected_by="disconnect"),
        fault(10.0, "recovery_started", generation=1, lost=["b"]),
        fault(10.5, "repartitioned", generation=1, cause="failure", planner="ftpipehd",
              stages=STAGES_2, predicted_throughput_sps=80.0, resume_microbatch=48),
        fault(12.0, "weights_redistributed", generation=1, bytes_moved=4_000_000, transfers=3,
              duration_s=1.2),
        fault(12.25, "recovered", generation=1, recovery_s=2.25, resume_microbatch=48,
              microbatches_redone=6),
    ]


def test_a_recovery_is_its_phases_and_the_time_between_them():
    [r] = fault_recoveries(one_recovery())
    assert r["generation"] == 1 and r["cause"] == "failure" and r["moved"] is True
    assert r["phase"] == "resumed" and r["lost"] == ["b"]
    assert r["losses"] == [{"device": "b", "detected_s": 10.0, "detected_by": "disconnect",
                            "reason": "control connection closed"}]
    assert (r["started_s"], r["detected_s"], r["replanned_s"], r["weights_moved_s"],
            r["resumed_s"]) == (10.0, 10.0, 10.5, 12.0, 12.25)
    assert r["replanning_s"] == pytest.approx(0.5)
    assert r["redistributing_s"] == pytest.approx(1.5)
    assert r["resuming_s"] == pytest.approx(0.25)
    assert r["recovery_s"] == 2.25  # the server's figure
    assert (r["planner"], r["stages"], r["predicted_throughput_sps"]) == (
        "ftpipehd", STAGES_2, 80.0)
    assert (r["resume_microbatch"], r["microbatches_redone"]) == (48, 6)
    assert (r["bytes_moved"], r["transfers"], r["weights_duration_s"]) == (4_000_000, 3, 1.2)
    assert r["saved_s"] is None and r["cost_s"] is None and r["error"] is None


def test_events_in_any_order_give_the_same_recoveries():
    events = one_recovery()
    assert fault_recoveries(list(reversed(events))) == fault_recoveries(events)


def test_a_recovery_under_way_stops_at_its_last_phase():
    [r] = fault_recoveries(one_recovery()[:4])
    assert r["phase"] == "replanned" and r["replanned_s"] == 10.5
    assert r["weights_moved_s"] is None and r["resumed_s"] is None
    assert r["redistributing_s"] is None and r["recovery_s"] is None


def test_without_the_servers_figure_recovery_runs_from_detection_to_resumption():
    events = one_recovery()
    events[-1] = fault(12.25, "recovered", generation=1)
    [r] = fault_recoveries(events)
    assert r["recovery_s"] == pytest.approx(2.25) and r["microbatches_redone"] is None


def restarted() -> list[dict[str, Any]]:
    """b lost; c lost too while the run re-deploys: the server starts the recovery again
    with the next generation and the union of the lost."""
    return [
        fault(10.0, "device_lost", "b", detected_by="heartbeat"),
        fault(10.0, "recovery_started", generation=1, lost=["b"]),
        fault(10.3, "repartitioned", generation=1, cause="failure", planner="ftpipehd",
              stages=STAGES_2, resume_microbatch=16),
        fault(10.4, "device_lost", "c", detected_by="probe"),
        fault(10.4, "recovery_started", generation=2, lost=["b", "c"]),
        fault(11.0, "repartitioned", generation=2, cause="failure", planner="ftpipehd",
              stages=[{"devices": ["a"], "layers": [0, 8]}], resume_microbatch=16),
        fault(11.5, "weights_redistributed", generation=2, bytes_moved=10, transfers=1),
        fault(11.5, "recovered", generation=2, recovery_s=1.5, microbatches_redone=2),
    ]


def test_a_loss_during_a_recovery_joins_it():
    [r] = fault_recoveries(restarted()[:5])
    assert r["phase"] == "detected" and r["generation"] == 2  # started again
    assert r["replanned_s"] == 10.3  # the plan it dropped
    [r] = fault_recoveries(restarted())
    assert r["lost"] == ["b", "c"] and r["generation"] == 2
    assert [(x["device"], x["detected_s"], x["detected_by"]) for x in r["losses"]] == [
        ("b", 10.0, "heartbeat"), ("c", 10.4, "probe")]
    assert r["detected_s"] == 10.0 and r["phase"] == "resumed"
    assert r["replanned_s"] == 11.0 and r["replanning_s"] == pytest.approx(1.0)
    assert r["stages"] == [{"devices": ["a"], "layers": [0, 8]}]


def test_a_dynamic_repartition_is_a_recovery_that_lost_nobody():
    events = [
        fault(59.5, "recovery_started", generation=2, lost=[]),
        fault(60.0, "repartitioned", generation=2, cause="dynamic", planner="ftpipehd",
              stages=STAGES_3, predicted_throughput_sps=120.0, resume_microbatch=400,
              saved_s=25.0, cost_s=4.0),
    ]
    [r] = fault_recoveries(events[:1])
    assert (r["cause"], r["phase"], r["generation"], r["lost"]) == ("dynamic", "started", 2, [])
    [r] = fault_recoveries(events)
    assert (r["cause"], r["phase"], r["started_s"], r["detected_s"]) == (
        "dynamic", "replanned", 59.5, None)
    assert r["replanning_s"] == pytest.approx(0.5)  # halting and planning, from the decision
    # a device lost meanwhile makes it a recovery from that loss
    events += [fault(60.5, "device_lost", "b", detected_by="disconnect"),
               fault(60.5, "recovery_started", generation=3, lost=["b"]),
               fault(61.0, "repartitioned", generation=3, cause="failure", planner="ftpipehd",
                     stages=STAGES_2, resume_microbatch=380),
               fault(62.0, "recovered", generation=3, recovery_s=2.5)]
    [r] = fault_recoveries(events)
    assert (r["cause"], r["phase"], r["generation"], r["lost"]) == ("failure", "resumed", 3,
                                                                    ["b"])
    assert (r["started_s"], r["detected_s"], r["replanned_s"]) == (59.5, 60.5, 61.0)
    assert (r["saved_s"], r["cost_s"], r["resume_microbatch"]) == (25.0, 4.0, 380)


def test_dynamic_repartitions_moved_and_skipped_are_listed_with_their_break_even():
    events = [
        *one_recovery(),
        fault(30.0, "repartition_skipped", saved_s=0.8, cost_s=3.0,
              predicted_throughput_sps=82.0, measured_throughput_sps=78.0),
        fault(59.5, "recovery_started", generation=2, lost=[]),
        fault(60.0, "repartitioned", generation=2, cause="dynamic", planner="ftpipehd",
              stages=STAGES_3, predicted_throughput_sps=120.0, resume_microbatch=400,
              saved_s=25.0, cost_s=4.0),
        fault(61.0, "weights_redistributed", generation=2, bytes_moved=2_000_000, transfers=2),
        fault(61.5, "recovered", generation=2, recovery_s=1.5, microbatches_redone=4),
    ]
    failure, skipped, moved = fault_recoveries(events)
    assert failure["generation"] == 1 and failure["cause"] == "failure"
    assert (skipped["cause"], skipped["moved"], skipped["phase"]) == ("dynamic", False,
                                                                       "skipped")
    assert (skipped["saved_s"], skipped["cost_s"], skipped["started_s"]) == (0.8, 3.0, 30.0)
    assert skipped["measured_throughput_sps"] == 78.0 and skipped["generation"] is None
    assert (moved["cause"], moved["moved"], moved["phase"], moved["generation"]) == (
        "dynamic", True, "resumed", 2)
    assert (moved["saved_s"], moved["cost_s"], moved["lost"]) == (25.0, 4.0, [])
    assert moved["detected_s"] is None and moved["replanned_s"] == 60.0
    assert moved["started_s"] == 59.5 and moved["replanning_s"] == pytest.approx(0.5)
    assert moved["redistributing_s"] == pytest.approx(1.0)
    assert moved["recovery_s"] == 1.5 and moved["microbatches_redone"] == 4


def test_a_run_that_fails_while_recovering_says_so():
    events = [*one_recovery()[:3], fault(10.2, "run_failed", reason="layer 4 has no copy")]
    [r] = fault_recoveries(events)
    assert r["phase"] == "failed" and r["error"] == "layer 4 has no copy"
    assert r["resumed_s"] is None and r["recovery_s"] is None


def test_a_loss_without_a_recovery_is_listed_and_control_events_are_not():
    events = [fault(0.0, "run_started"), fault(5.0, "run_paused"),
              fault(7.0, "device_lost", "b", detected_by="killed"),
              fault(7.0, "run_failed", reason="device b was lost")]
    [r] = fault_recoveries(events)
    assert r["lost"] == ["b"] and r["generation"] is None and r["phase"] == "failed"
    assert fault_recoveries([fault(0.0, "run_started"), fault(3.0, "device_joined", "d")]) == []


def test_a_repartition_without_its_start_is_a_dynamic_one_of_its_own():
    [r] = fault_recoveries([fault(5.0, "repartitioned", generation=1, planner="ftpipehd",
                                  stages=STAGES_3)])
    assert (r["cause"], r["phase"], r["started_s"], r["replanning_s"]) == (
        "dynamic", "replanned", 5.0, 0.0)


# --------------------------------------------------------------------------- the summary


def timeline_rows(run, device: str, stage: int, starts: list[float]) -> list[TimelineEvent]:
    return [TimelineEvent(run=run, device=device, stage=stage, kind=kind, microbatch=m,
                          version=0, start=t + (0.05 if kind == "backward" else 0.0),
                          end=t + 0.1)
            for m, t in enumerate(starts) for kind in ("forward", "backward")]


@pytest.mark.django_db
def test_the_summary_without_faults_has_empty_fault_figures():
    run = RunFactory(microbatches=4)
    a, b = (rd.device.uid for rd in run.run_devices.order_by("position"))
    TimelineEvent.objects.bulk_create([*timeline_rows(run, a, 0, [0.0, 1.0, 2.0, 3.0]),
                                       *timeline_rows(run, b, 1, [0.5, 1.5, 2.5, 3.5])])
    summary = run_summary(run=run)
    assert summary["faults"] == [] and summary["batches_lost"] == 0
    assert summary["throughput_after_sps"] is None
    assert summary["microbatches"] == 4 and summary["batches"] == 1


@pytest.mark.django_db
def test_the_summary_of_a_run_that_recovered_from_a_lost_device():
    a, b, c = (DeviceFactory(uid=uid) for uid in ("a", "b", "c"))
    run = RunFactory(devices=[a, b, c], microbatches=4)
    # three stages until b is lost at 10 s, two (a, then c) from 12.25 s to 20.1 s
    before = [0.5 * k for k in range(20)]  # 0 .. 9.5
    after = [12.25 + 0.5 * k for k in range(16)]  # 12.25 .. 19.75 (+0.1: 19.85 ends last)
    TimelineEvent.objects.bulk_create([
        *timeline_rows(run, "a", 0, before), *timeline_rows(run, "b", 1, before),
        *timeline_rows(run, "c", 2, before),
        *timeline_rows(run, "a", 0, after), *timeline_rows(run, "c", 1, after)])
    FaultEvent.objects.bulk_create(
        FaultEvent(run=run, at=f["at"], kind=f["kind"], device=f["device"] or "",
                   detail=f["detail"]) for f in one_recovery())
    summary = run_summary(run=run)
    assert summary["faults"] == [{"device": "b", "detected_s": 10.0, "resumed_s": 12.25,
                                  "recovery_s": 2.25}]
    assert summary["batches_lost"] == 1.5  # 6 micro-batches redone, 4 a batch
    # the last stage's backwards: c's at stage 2 before, c's at stage 1 after
    assert summary["microbatches"] == 20 + 16
    makespan = 19.75 + 0.1
    assert summary["makespan_s"] == pytest.approx(makespan)
    batch_size = run.model_spec.batch_size
    assert summary["throughput_after_sps"] == pytest.approx(
        16 * batch_size / (makespan - 12.25))


@pytest.mark.django_db
def test_the_summary_rounds_batches_lost_and_counts_every_lost_device():
    run = RunFactory(microbatches=3)
    FaultEvent.objects.bulk_create([
        FaultEvent(run=run, at=4.0, kind="device_lost", device="x",
                   detail={"detected_by": "heartbeat"}),
        FaultEvent(run=run, at=4.5, kind="device_lost", device="y",
                   detail={"detected_by": "probe"}),
        FaultEvent(run=run, at=4.5, kind="recovery_started",
                   detail={"generation": 1, "lost": ["x", "y"]}),
        FaultEvent(run=run, at=6.0, kind="recovered",
                   detail={"generation": 1, "recovery_s": 2.0, "microbatches_redone": 2}),
    ])
    summary = run_summary(run=run)
    assert summary["faults"] == [
        {"device": "x", "detected_s": 4.0, "resumed_s": 6.0, "recovery_s": 2.0},
        {"device": "y", "detected_s": 4.5, "resumed_s": 6.0, "recovery_s": 2.0}]
    assert summary["batches_lost"] == 0.67
    assert summary["throughput_after_sps"] is None  # no timeline after it
