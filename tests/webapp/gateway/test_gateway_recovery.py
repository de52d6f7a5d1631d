"""A run that loses an agent, through the real ASGI application: the survivors halt and say
what they hold, the next generation is planned and deployed, and the run resumes (paused, from
the seed, or started on the others, as the loss finds it)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from tests.webapp.gateway.agents import connect_all, holdings, planned_run, recover, running
from webapp.runs import services
from webapp.runs.models import FaultEvent, Run, RunDevice

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_agent_that_disappears_makes_the_run_recover_without_it() -> None:
    run, devices = planned_run()

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], Run]:
        agents, specs = await running(devices, run)
        await agents[1].disconnect()  # the middle stage's agent
        survivors = [agents[0], agents[2]]
        halts, deploys, starts = await recover(
            survivors, [holdings(specs[0], specs, 4), holdings(specs[2], specs, 4)], run)
        recovered = await database_sync_to_async(Run.objects.get)(pk=run.pk)
        for a in survivors:
            await a.disconnect()
        return halts + deploys, starts, recovered

    commands, starts, recovering = async_to_sync(scenario)()
    halts, deploys = commands[:2], commands[2:]
    assert [h["command"] for h in halts] == ["halt", "halt"]
    assert {h["generation"] for h in halts} == {1}
    assert [d["command"] for d in deploys] == ["deploy", "deploy"]
    specs = [d["spec"] for d in deploys]
    assert {s["generation"] for s in specs} == {1}
    assert {s["first_microbatch"] for s in specs} == {4}  # the resume point
    # the survivors split the model (in the optimal plan's order); the lost middle stage's
    # layers come from its chain replica on the last stage's device
    assert {s["device"] for s in specs} == {devices[0].uid, devices[2].uid}
    ordered = sorted(specs, key=lambda s: s["stage"])
    assert ordered[0]["layers"][0] == 0 and ordered[-1]["layers"][1] == 3
    parts = [p for d in deploys for p in d["restore"]]
    assert {(p["device"], p["source"]) for p in parts if p["source"] != "self"} <= {
        (devices[0].uid, devices[2].uid), (devices[2].uid, devices[0].uid)}
    covered = sorted(i for p in parts for i in range(p["layers"][0], p["layers"][1] + 1))
    assert covered == [0, 1, 2, 3]
    assert {s["command"] for s in starts} == {"start"} and {s["generation"] for s in starts} == {1}
    assert recovering.state == Run.State.RUNNING, recovering.error
    assert recovering.generation == 1
    kinds = list(FaultEvent.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds[:6] == ["run_started", "device_lost", "recovery_started", "repartitioned",
                         "weights_redistributed", "recovered"]  # then the test's own goodbyes
    lost = FaultEvent.objects.filter(run=run, kind="device_lost").first()
    assert lost is not None
    assert lost.device == devices[1].uid and lost.detail["detected_by"] == "disconnect"
    recovered = FaultEvent.objects.get(run=run, kind="recovered")
    assert recovered.detail["resume_microbatch"] == 4
    assert RunDevice.objects.get(run=run, device=devices[1]).stage_state == "lost"


def test_a_paused_run_that_loses_a_device_recovers_paused_and_resumes_when_asked() -> None:
    run, devices = planned_run()

    async def scenario() -> tuple[Run, list[dict[str, Any]], Run, list[dict[str, Any]]]:
        agents, specs = await running(devices, run)
        await database_sync_to_async(services.run_pause)(run=run)
        for a in agents:
            assert (await a.receive_json_from(timeout=5))["command"] == "pause"
        await agents[1].disconnect()  # lost while paused: it used to fail the run
        survivors = [agents[0], agents[2]]
        _, _, starts = await recover(
            survivors, [holdings(specs[0], specs, 4), holdings(specs[2], specs, 4)], run)
        recovered = await database_sync_to_async(Run.objects.get)(pk=run.pk)
        await database_sync_to_async(services.run_start)(run=recovered)  # Resume
        resumes = [await a.receive_json_from(timeout=5) for a in survivors]
        resumed = await database_sync_to_async(Run.objects.get)(pk=run.pk)
        for a in survivors:
            await a.disconnect()
        return recovered, starts, resumed, resumes

    recovered, starts, resumed, resumes = async_to_sync(scenario)()
    assert recovered.state == Run.State.PAUSED, recovered.error
    assert recovered.generation == 1
    assert [(s["command"], s["generation"], s["paused"]) for s in starts] == [
        ("start", 1, True)] * 2  # the new stages wait for a resume
    assert [r["command"] for r in resumes] == ["resume", "resume"]
    assert resumed.state == Run.State.RUNNING
    kinds = list(FaultEvent.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds[:7] == ["run_started", "run_paused", "device_lost", "recovery_started",
                         "repartitioned", "weights_redistributed", "recovered"]
    assert FaultEvent.objects.get(run=run, kind="recovered").detail["paused"] is True


def test_a_pause_asked_for_during_a_recovery_pauses_the_run_when_it_ends() -> None:
    run, devices = planned_run()

    async def scenario() -> tuple[Run, Run, list[dict[str, Any]]]:
        agents, specs = await running(devices, run)
        await agents[1].disconnect()
        pausing = await database_sync_to_async(services.run_pause)(run=run)
        survivors = [agents[0], agents[2]]
        _, _, starts = await recover(
            survivors, [holdings(specs[0], specs, 4), holdings(specs[2], specs, 4)], run)
        after = await database_sync_to_async(Run.objects.get)(pk=run.pk)
        for a in survivors:
            await a.disconnect()
        return pausing, after, starts

    pausing, after, starts = async_to_sync(scenario)()
    # the recovery went on (it used to be stranded: halts and readies of a paused run were
    # ignored), and the run is paused once it ended
    assert pausing.state == Run.State.RECOVERING
    assert after.state == Run.State.PAUSED, after.error
    assert after.generation == 1
    assert {(s["command"], s["paused"]) for s in starts} == {("start", True)}
    paused = FaultEvent.objects.get(run=run, kind="run_paused")
    assert paused.detail == {"after_recovery": True}


def test_a_recovery_with_a_layer_copied_nowhere_starts_again_from_the_seed() -> None:
    # the lost device's layers had no copy anywhere (no replica yet): the run failed; the
    # run's seed is a copy of every layer at micro-batch 0, and the recovery says it used it
    run, devices = planned_run()

    async def scenario() -> list[dict[str, Any]]:
        agents, specs = await running(devices, run)
        await agents[1].disconnect()
        for a, spec in zip([agents[0], agents[2]], [specs[0], specs[2]], strict=True):
            halt = await a.receive_json_from(timeout=5)
            own = [{"layers": spec["layers"], "applied": 4, "kind": "own"}]  # no replicas
            await a.send_json_to({"type": "ack", "id": halt["id"], "command": "halt",
                                  "run": run.pk, "ok": True, "generation": 1, "holdings": own})
        deploys = [await a.receive_json_from(timeout=5) for a in (agents[0], agents[2])]
        for a in (agents[0], agents[2]):
            await a.disconnect()
        return deploys

    deploys = async_to_sync(scenario)()
    assert [d["command"] for d in deploys] == ["deploy", "deploy"]
    assert {d["spec"]["first_microbatch"] for d in deploys} == {0}
    assert all(not d.get("restore") for d in deploys)  # every layer from the seed
    [detail] = FaultEvent.objects.filter(run=run, kind="repartitioned").values_list(
        "detail", flat=True)
    assert "has no copy anywhere" in detail["from_seed"]
    assert detail["resume_microbatch"] == 0


@pytest.mark.parametrize("policy", ["replan", "respipe"])
def test_an_agent_that_disappears_while_the_run_starts_makes_it_start_on_the_others(
        policy: str) -> None:
    run, devices = planned_run(recovery_policy=policy)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], Run]:
        agents = await connect_all(devices)
        await database_sync_to_async(services.run_start)(run=run)
        for a in agents:
            assert (await a.receive_json_from(timeout=5))["command"] == "deploy"
        await agents[2].disconnect()  # lost before any stage was ready: it failed the run
        survivors = agents[:2]
        _, deploys, starts = await recover(survivors, [[], []], run)  # nothing trained
        started = await database_sync_to_async(Run.objects.get)(pk=run.pk)
        for a in survivors:
            await a.disconnect()
        return deploys, starts, started

    deploys, starts, started = async_to_sync(scenario)()
    assert started.state == Run.State.RUNNING, started.error
    assert started.started_at is not None and started.generation == 1
    specs = [d["spec"] for d in deploys]
    assert {s["device"] for s in specs} == {devices[0].uid, devices[1].uid}
    assert {s["first_microbatch"] for s in specs} == {0}  # from the start
    covered = sorted(i for s in specs for i in range(s["layers"][0], s["layers"][1] + 1))
    assert covered == [0, 1, 2, 3]
    assert [d["restore"] for d in deploys] == [[], []]  # built from the run's seed
    assert {(s["command"], s["generation"]) for s in starts} == {("start", 1)}
    kinds = list(FaultEvent.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds[:6] == ["device_lost", "recovery_started", "repartitioned",
                         "weights_redistributed", "recovered", "run_started"]
    lost = FaultEvent.objects.filter(run=run, kind="device_lost").first()  # then the goodbyes
    assert lost is not None and lost.device == devices[2].uid
    assert RunDevice.objects.get(run=run, device=devices[2]).stage_state == "lost"


@pytest.mark.parametrize(("bandwidth_bps", "chosen"), [(12_500_000.0, "shrunk"),
                                                       (100_000.0, "replanned")])
def test_a_lost_replica_shrinks_its_group_or_replans_whichever_pays(bandwidth_bps: float,
                                                                    chosen: str) -> None:
    # data parallelism (bsp: one stage, three replicas); one replica's agent disappears. On
    # fast links the two replicas left train faster than any re-plan: the group shrinks
    # (nothing moves, the survivors hold the stage). On slow ones sharing gradients bounds
    # them, and the re-plan (one device, no gradients to share) wins: every replica holds the
    # whole model, so it moves nothing either, and the time it saves decides
    run, devices = planned_run(algorithm="bsp", batches=50,
                               device_fields={"bandwidth_bps": bandwidth_bps})

    async def scenario() -> tuple[list[dict[str, Any]], Run]:
        agents, specs = await running(devices, run)
        assert all(s["stage_devices"] == [[d.uid for d in devices]] for s in specs)
        await agents[1].disconnect()
        survivors = [agents[0], agents[2]]
        own = [{"layers": specs[0]["layers"], "applied": 4, "kind": "own"}]
        _, deploys, _ = await recover(survivors, [own, own], run)
        recovered = await database_sync_to_async(Run.objects.get)(pk=run.pk)
        for a in survivors:
            await a.disconnect()
        return deploys, recovered

    deploys, recovered = async_to_sync(scenario)()
    assert recovered.state == Run.State.RUNNING, recovered.error
    event = FaultEvent.objects.get(run=run, kind="repartitioned")
    assert event.detail["chosen"] == chosen
    assert event.detail["saved_s"] is not None and event.detail["cost_s"] is not None
    specs = [d["spec"] for d in deploys]
    survivors = {devices[0].uid, devices[2].uid}
    if chosen == "shrunk":
        assert event.detail["planner"] == "bsp, shrunk"
        assert all(s["stage_devices"] == [sorted(survivors, key=[d.uid for d in devices]
                                                 .index)] for s in specs)
        assert all(p["source"] == "self" for d in deploys for p in d["restore"])
    else:
        assert event.detail["planner"] == "optimal"
        assert all(len(group) == 1 for s in specs for group in s["stage_devices"])
