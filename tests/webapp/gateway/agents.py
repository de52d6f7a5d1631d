"""Agents of the gateway tests: WebSocket communicators on the real ASGI application that
connect as enrolled devices, a planned run, and the agents' side of a start and a recovery."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from tests.webapp.factories import (
    DATA_KEY,
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    RunFactory,
)
from webapp.asgi import application
from webapp.devices.models import Device
from webapp.runs import services
from webapp.runs.models import Run


def agent(device: Device, key: str | None = None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Device {device.uid}:{key or device.key}".encode())]
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


def planned_run(count: int = 3, *, algorithm: str = "ftpipehd",
                device_fields: dict[str, Any] | None = None, **fields: Any
                ) -> tuple[Run, list[Device]]:
    spec = ModelSpecFactory()
    devices = [DeviceFactory(data_address="", **(device_fields or {})) for _ in range(count)]
    for k, device in enumerate(devices):
        LayerProfileFactory(device=device, model_spec=spec, scale=1.0 + k)
    run = RunFactory(model_spec=spec, devices=devices, algorithms=[algorithm], microbatches=4,
                     **{"batches": 2, **fields})
    services.run_plan(run=run)
    run.refresh_from_db()
    assert run.state == Run.State.PLANNED
    return run, devices


async def connect_all(devices: Sequence[Device]) -> list[WebsocketCommunicator]:
    agents = []
    for k, device in enumerate(devices):
        link = agent(device)
        connected, _ = await link.connect()
        assert connected
        await link.send_json_to({"type": "hello", "data_key": DATA_KEY,
                                 "data_address": f"tcp://127.0.0.1:{6000 + k}",
                                 "hardware": {"cpus": 4}})
        welcome = await link.receive_json_from(timeout=5)
        assert welcome == {"type": "welcome", "device": device.uid, "name": device.name}
        agents.append(link)
    return agents


async def deployed(devices: Sequence[Device], run: Run
                   ) -> tuple[list[WebsocketCommunicator], list[dict[str, Any]],
                              list[dict[str, Any]]]:
    """Connect the agents, start the run, ack every deployment: the agents, their deployments
    and the commands that follow (the starts)."""
    agents = await connect_all(devices)
    await database_sync_to_async(services.run_start)(run=run)
    deploys = [await a.receive_json_from(timeout=5) for a in agents]
    for a, command in zip(agents, deploys, strict=True):
        await a.send_json_to({"type": "ack", "id": command["id"], "command": "deploy",
                              "run": run.pk, "ok": True})
    return agents, deploys, [await a.receive_json_from(timeout=5) for a in agents]


async def running(devices: Sequence[Device], run: Run
                  ) -> tuple[list[WebsocketCommunicator], list[dict[str, Any]]]:
    """Connect the agents, start the run, ack every deployment; the agents and their specs."""
    agents, deploys, starts = await deployed(devices, run)
    assert [s["command"] for s in starts] == ["start"] * len(agents)
    return agents, [d["spec"] for d in deploys]


def holdings(spec: dict[str, Any], specs: list[dict[str, Any]], applied: int
              ) -> list[dict[str, Any]]:
    """What a halted agent holds: its own stage and the chain replica of the stage before."""
    before = specs[(spec["stage"] - 1) % len(specs)]
    return [{"layers": spec["layers"], "applied": applied, "kind": "own"},
            {"layers": before["layers"], "applied": applied, "kind": "replica"}]


async def recover(survivors: list[Any], holdings: list[list[dict[str, Any]]], run: Run
                   ) -> tuple[list[dict[str, Any]], ...]:
    """Answer a recovery as the survivors' agents do: halt saying what each holds, ack the
    deployments; the halts, the deployments and the commands that follow them (the starts)."""
    halts = []
    for a, held in zip(survivors, holdings, strict=True):
        halt = await a.receive_json_from(timeout=5)
        assert halt["command"] == "halt"
        halts.append(halt)
        await a.send_json_to({"type": "ack", "id": halt["id"], "command": "halt",
                              "run": run.pk, "ok": True, "generation": halt["generation"],
                              "holdings": held})
    deploys = [await a.receive_json_from(timeout=5) for a in survivors]
    for a, deploy in zip(survivors, deploys, strict=True):
        assert deploy["command"] == "deploy"
        await a.send_json_to({"type": "ack", "id": deploy["id"], "command": "deploy",
                              "run": run.pk, "ok": True,
                              "generation": deploy["spec"]["generation"]})
    return halts, deploys, [await a.receive_json_from(timeout=5) for a in survivors]
