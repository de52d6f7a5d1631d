"""The ResNet-101 testbed of data/profiles as agents would report it: each device's enrolment
body and its own measured profile (the model's layer sizes with that device's layer times)."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import DATA

MODEL = json.loads((DATA / "profiles" / "resnet101_cifar10.model.json").read_text())
DEVICES = json.loads((DATA / "profiles" / "resnet101_cifar10.devices.json").read_text())["devices"]
SPEC = {"model": MODEL["model"], "dataset": MODEL["dataset"], "batch_size": MODEL["batch_size"]}


def enrol_body(device: dict[str, Any], token: str) -> dict[str, Any]:
    return {"token": token, "name": device["id"], "memory_bytes": device["memory_bytes"],
            "bandwidth_bps": device["bandwidth_bps"], "latency_s": device["latency_s"],
            "speed": device["speed"], "hardware": {"description": device["label"]}}


def device_profile(device: dict[str, Any]) -> dict[str, Any]:
    """The model profile as measured on ``device``."""
    times = device["layer_times"]
    layers = [{**layer, "forward_s": f, "backward_s": b}
              for layer, f, b in zip(MODEL["layers"], times["forward_s"], times["backward_s"],
                                     strict=True)]
    return {**MODEL, "reference": device["id"], "layers": layers}
