"""The devices' system figures (CPU, memory, temperature; orchestrator.protocol.SYSTEM_METRICS)
as the server takes them: stored as metric points of their kinds, a bad one refused alone
naming its field, and on the run page's snapshot and deltas as the other metrics are."""

import pytest

from orchestrator.protocol import SYSTEM_METRICS
from tests.webapp.factories import DeviceFactory, RunFactory
from tests.webapp.runs.test_events import drain, subscribe
from webapp.runs import events, services
from webapp.runs.models import MetricPoint, Run


def test_every_system_kind_is_a_metric_kind_the_table_holds():
    kinds = {value for value, _ in MetricPoint.Kind.choices}
    assert set(SYSTEM_METRICS) <= kinds
    limit = MetricPoint._meta.get_field("kind").max_length
    assert all(len(kind) <= limit for kind in SYSTEM_METRICS)


@pytest.mark.django_db(transaction=True)
def test_system_points_are_stored_sent_live_and_in_the_snapshot():
    # Prepare
    device = DeviceFactory()
    run = RunFactory(state=Run.State.RUNNING, devices=[device])
    channel = subscribe(run.pk)
    good = [{"at": 4.0, "kind": "cpu_pct", "device": device.uid, "value": 63.5},
            {"at": 4.0, "kind": "proc_rss_bytes", "device": device.uid, "value": 4.5e8},
            {"at": 4.0, "kind": "temp_c", "device": device.uid, "value": 58.0}]
    bad = [{"at": 4.0, "kind": "cpu_pct", "device": device.uid, "value": 180.0},
           {"at": 4.0, "kind": "mem_used_bytes", "device": "", "value": 1e9},
           {"at": 4.0, "kind": "temp_c", "device": device.uid, "value": float("nan")}]

    # Execute
    stored = services.run_events_store(run=run, device=device, metrics=[*good[:2], *bad,
                                                                          good[2]])

    # Assert: the good ones stored, each bad one refused naming its field
    assert stored["metrics"] == 3
    assert [(r["field"], r["reason"].split(",")[0]) for r in stored["refused"]] == [
        ("metrics[2].value", "must be from 0 to 100 for cpu_pct"),
        ("metrics[3].device", "must name the device a mem_used_bytes point is of"),
        ("metrics[4].value", "must be a finite number")]
    rows = MetricPoint.objects.filter(run=run).order_by("kind")
    assert [(r.kind, r.device, r.value) for r in rows] == [
        ("cpu_pct", device.uid, 63.5), ("proc_rss_bytes", device.uid, 4.5e8),
        ("temp_c", device.uid, 58.0)]
    [delta] = [m["event"] for m in drain(channel) if m["event"]["type"] == "metrics"]
    assert delta["points"] == good
    snapshot = events.run_snapshot(Run.objects.get(pk=run.pk))
    assert sorted(snapshot["metrics"], key=lambda p: p["kind"]) == good
