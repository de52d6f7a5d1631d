"""The ResNet-101 testbed enrolled and profiled through the API, as agents would do it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from tests.webapp import testbed
from tests.webapp.factories import EnrollmentTokenFactory


@dataclass(frozen=True)
class Enrolled:
    id: int
    uid: str
    authorization: str
    name: str


@dataclass(frozen=True)
class Testbed:
    spec: int
    devices: list[Enrolled]

    @property
    def ids(self) -> list[int]:
        return [d.id for d in self.devices]


@pytest.fixture
def resnet_testbed(api: APIClient) -> Testbed:
    """The five devices of data/profiles enrolled with one token, each having uploaded the
    profile it measured, and the ResNet-101 model spec."""
    token = EnrollmentTokenFactory(max_uses=len(testbed.DEVICES))
    spec = api.post("/api/model-specs/", testbed.SPEC, format="json").json()["id"]
    devices = []
    for raw in testbed.DEVICES:
        body = APIClient().post("/api/agent/enrol/", testbed.enrol_body(raw, token.secret),
                                format="json").json()
        uploaded = APIClient().post(
            "/api/agent/profiles/", {"model_spec": spec, "profile": testbed.device_profile(raw)},
            format="json", HTTP_AUTHORIZATION=body["authorization"])
        assert uploaded.status_code == 201, uploaded.json()
        devices.append(Enrolled(body["id"], body["uid"], body["authorization"], raw["id"]))
    return Testbed(spec=spec, devices=devices)
