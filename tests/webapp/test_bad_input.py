"""Every field of every write endpoint, given a wrong value, is a 400 naming that field.

Each endpoint has a valid body (checked to succeed), and each case changes one field of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.webapp.factories import (
    DeviceFactory,
    EnrollmentTokenFactory,
    ModelSpecFactory,
    PlanFactory,
    RunFactory,
    UserFactory,
    profile_document,
)
from webapp.devices.models import Device
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

MISSING = object()


@dataclass
class Endpoint:
    client: APIClient
    method: str
    url: str
    body: dict[str, Any]
    ok: int


def _agent(device: Device) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Device {device.uid}:{device.key}")
    return client


def token_create(api: APIClient) -> Endpoint:
    staff = APIClient()  # only staff users create enrolment tokens
    staff.force_login(UserFactory(is_staff=True))
    return Endpoint(staff, "post", "/api/enrollment-tokens/",
                    {"label": "lab", "max_uses": 2, "expires_in_s": 3600}, 201)


def device_rename(api: APIClient) -> Endpoint:
    return Endpoint(api, "patch", f"/api/devices/{DeviceFactory().pk}/", {"name": "pi"}, 200)


def model_spec_create(api: APIClient) -> Endpoint:
    return Endpoint(api, "post", "/api/model-specs/",
                    {"model": "vgg5", "dataset": "digits", "batch_size": 64}, 201)


def enrol(api: APIClient) -> Endpoint:
    return Endpoint(APIClient(), "post", "/api/agent/enrol/", {
        "token": EnrollmentTokenFactory().secret, "name": "pi", "hardware": {"os": "Linux"},
        "memory_bytes": 2**30, "bandwidth_bps": 1.25e6, "latency_s": 0.01,
        "uplink_bps": 1e6, "downlink_bps": 3e6, "speed": 0.2}, 201)


def heartbeat(api: APIClient) -> Endpoint:
    return Endpoint(_agent(DeviceFactory()), "post", "/api/agent/heartbeat/",
                    {"status": "busy"}, 200)


def profile_upload(api: APIClient) -> Endpoint:
    spec = ModelSpecFactory()
    return Endpoint(_agent(DeviceFactory()), "post", "/api/agent/profiles/",
                    {"model_spec": spec.pk, "profile": profile_document()}, 201)


def run_create(api: APIClient) -> Endpoint:
    devices = [DeviceFactory(), DeviceFactory()]
    return Endpoint(api, "post", "/api/runs/", {
        "name": "r", "model_spec": ModelSpecFactory().pk, "devices": [d.pk for d in devices],
        "algorithms": ["ftpipehd"], "schedule": "gpipe", "microbatches": 4, "batches": 10,
        "epochs": 2, "chain_every": 1, "global_every": 0, "repartition_after": 5,
        "repartition_every": 50, "lr": 0.05, "momentum": 0.9, "vertical_sync": True,
        "aggregate_every": 0}, 201)


def run_plan(api: APIClient) -> Endpoint:
    return Endpoint(api, "post", f"/api/runs/{RunFactory().pk}/plan/",
                    {"algorithms": ["uniform", "bsp"]}, 202)


def run_start(api: APIClient) -> Endpoint:
    run = RunFactory(state=Run.State.PLANNED)
    return Endpoint(api, "post", f"/api/runs/{run.pk}/start/", {"plan": PlanFactory(run=run).pk},
                    200)


def split_study_create(api: APIClient) -> Endpoint:
    return Endpoint(api, "post", "/api/split/studies/", {
        "name": "s", "file": "data/sl/resnet101_mnist.jsonl", "index": 0,
        "methods": ["balanced-greedy", "auto"], "time_limit_s": 2.0, "switch_slots": 1,
        "seed": 3}, 201)


def run_events(api: APIClient) -> Endpoint:
    device = DeviceFactory()
    run = RunFactory(state=Run.State.RUNNING, devices=[device])
    event = {"run": run.pk, "device": device.uid, "stage": 0, "kind": "forward",
             "microbatch": 0, "version": 0, "start": 0.0, "end": 0.1}
    fault = {"run": run.pk, "at": 1.0, "kind": "device_joined", "device": device.uid}
    metric = {"at": 1.0, "kind": "loss", "value": 2.3}
    return Endpoint(_agent(device), "post", f"/api/agent/runs/{run.pk}/events/",
                    {"timeline": [event], "faults": [fault], "metrics": [metric]}, 201)


ENDPOINTS: dict[str, Callable[[APIClient], Endpoint]] = {
    "token_create": token_create, "device_rename": device_rename,
    "model_spec_create": model_spec_create, "enrol": enrol, "heartbeat": heartbeat,
    "profile_upload": profile_upload, "run_create": run_create, "run_plan": run_plan,
    "run_start": run_start, "run_events": run_events, "split_study_create": split_study_create,
}


def bad_layer(document: dict[str, Any]) -> dict[str, Any]:
    layers = [dict(la) for la in document["layers"]]
    layers[1]["backward_s"] = "slow"
    return {**document, "layers": layers}


# (endpoint, field, wrong value or a function of the valid one, field named in the answer,
#  start of the reason)
CASES = [
    ("token_create", "label", "x" * 101, "label", "Ensure this field has no more than 100"),
    ("token_create", "label", 7, "label", "must be a string"),
    ("token_create", "max_uses", 0, "max_uses", "Ensure this value is greater than or equal"),
    ("token_create", "max_uses", "2", "max_uses", "must be an integer"),
    ("token_create", "expires_in_s", 10, "expires_in_s", "Ensure this value is greater than"),
    ("token_create", "expires_in_s", 10**9, "expires_in_s", "Ensure this value is less than"),
    ("device_rename", "name", "", "name", "This field may not be blank"),
    ("device_rename", "name", MISSING, "name", "This field is required"),
    ("device_rename", "name", ["pi"], "name", "must be a string"),
    ("model_spec_create", "model", "", "model", "This field may not be blank"),
    ("model_spec_create", "dataset", None, "dataset", "This field may not be null"),
    ("model_spec_create", "batch_size", 0, "batch_size", "Ensure this value is greater"),
    ("model_spec_create", "batch_size", 1.5, "batch_size", "must be an integer"),
    ("enrol", "token", "ept_not-a-token", "token", "is not a valid enrolment token"),
    ("enrol", "token", MISSING, "token", "This field is required"),
    ("enrol", "name", "", "name", "This field may not be blank"),
    ("enrol", "hardware", ["cpu"], "hardware", "must be a JSON object"),
    ("enrol", "memory_bytes", 0, "memory_bytes", "Ensure this value is greater"),
    ("enrol", "memory_bytes", "4GB", "memory_bytes", "must be an integer"),
    ("enrol", "memory_bytes", 10**30, "memory_bytes", "Ensure this value is less than"),
    ("enrol", "bandwidth_bps", True, "bandwidth_bps", "must be a finite number"),
    ("enrol", "bandwidth_bps", 0, "bandwidth_bps", "Ensure this value is greater"),
    ("enrol", "latency_s", -0.1, "latency_s", "Ensure this value is greater"),
    ("enrol", "uplink_bps", "fast", "uplink_bps", "must be a finite number"),
    ("enrol", "downlink_bps", 0, "downlink_bps", "Ensure this value is greater"),
    ("enrol", "speed", 0, "speed", "Ensure this value is greater"),
    ("heartbeat", "status", "retired", "status", '"retired" is not a valid choice'),
    ("profile_upload", "model_spec", 999, "model_spec", 'Invalid pk "999"'),
    ("profile_upload", "model_spec", "mlp", "model_spec", "Incorrect type"),
    ("profile_upload", "profile", [], "profile", "must be a JSON object"),
    ("profile_upload", "profile", bad_layer(profile_document()), "profile.layers[1].backward_s",
     "must be a number"),
    ("profile_upload", "profile", {**profile_document(), "model": "vgg5"}, "profile.model",
     "is 'vgg5' but model spec"),
    ("profile_upload", "profile", {**profile_document(), "speed": 2}, "profile.speed",
     "is not a known field"),
    ("run_create", "name", "", "name", "This field may not be blank"),
    ("run_create", "model_spec", 999, "model_spec", 'Invalid pk "999"'),
    ("run_create", "devices", [], "devices", "This list may not be empty"),
    ("run_create", "devices", [999], "devices[0]", 'Invalid pk "999"'),
    ("run_create", "devices", "all", "devices", 'Expected a list of items'),
    ("run_create", "algorithms", ["ftpipehd", "magic"], "algorithms[1]",
     "unknown algorithm 'magic'"),
    ("run_create", "algorithms", [3], "algorithms[0]", "must be a string"),
    ("run_create", "schedule", "zigzag", "schedule", '"zigzag" is not a valid choice'),
    ("run_create", "microbatches", 0, "microbatches", "Ensure this value is greater"),
    ("run_create", "microbatches", "8", "microbatches", "must be an integer"),
    ("run_create", "batches", -3, "batches", "Ensure this value is greater"),
    ("run_create", "epochs", 2.5, "epochs", "must be an integer"),
    ("run_create", "chain_every", -1, "chain_every", "Ensure this value is greater than or "
                                                    "equal to 0"),
    ("run_create", "global_every", "10", "global_every", "must be an integer"),
    ("run_create", "repartition_after", 0, "repartition_after", "Ensure this value is greater "
                                                                "than or equal to 1"),
    ("run_create", "repartition_every", 1.5, "repartition_every", "must be an integer"),
    ("run_create", "lr", 0, "lr", "Ensure this value is greater than or equal to 1e-09"),
    ("run_create", "lr", "fast", "lr", "must be a finite number"),
    ("run_create", "lr", "nan", "lr", "must be a finite number"),
    ("run_create", "momentum", 1, "momentum", "Ensure this value is less than or equal to 0.999"),
    ("run_create", "momentum", -0.5, "momentum", "Ensure this value is greater than or equal"),
    ("run_create", "vertical_sync", "true", "vertical_sync", "must be true or false"),
    ("run_create", "aggregate_every", 1001, "aggregate_every",
     "Ensure this value is less than or equal to 1000"),
    ("run_create", "aggregate_every", 2, "aggregate_every", "must be 0 under gpipe"),
    ("run_plan", "algorithms", "uniform", "algorithms", "Expected a list of items"),
    ("run_plan", "algorithms", ["uniform", "uniform"], "algorithms[1]", "repeats 'uniform'"),
    ("run_plan", "algorithms", [], "algorithms", "This list may not be empty"),
    ("run_start", "plan", 999, "plan", "plan 999 is not a plan of run"),
    ("run_start", "plan", "best", "plan", "must be an integer"),
    ("run_events", "timeline", {"run": 1}, "timeline", "Expected a list of items"),
    ("run_events", "timeline", [{"kind": "forward"}], "timeline[0].run", "is missing"),
    ("run_events", "timeline", lambda events: [{**events[0], "microbatch": 2**40}],
     "timeline[0].microbatch", "must be at most 2147483647"),
    ("run_events", "faults", [{"run": 1, "at": -1.0, "kind": "device_lost"}], "faults[0].at",
     "must not be negative"),
    ("run_events", "metrics", [{"at": 1.0, "kind": "joy", "value": 1.0}], "metrics[0].kind",
     '"joy" is not a valid choice'),
    ("run_events", "metrics", [{"at": 1.0, "kind": "loss", "value": "low"}], "metrics[0].value",
     "must be a finite number"),
    ("split_study_create", "name", "", "name", "This field may not be blank"),
    ("split_study_create", "name", 5, "name", "must be a string"),
    ("split_study_create", "instance", {"name": "mine"}, "instance",
     "give an instance document or a shared file and index, not both"),
    ("split_study_create", "instance", [1], "instance", "must be a JSON object"),
    ("split_study_create", "file", "data/sl/other.jsonl", "file",
     "'data/sl/other.jsonl' is not a shared instance file"),
    ("split_study_create", "file", 3, "file", "must be a string"),
    ("split_study_create", "index", 36, "index", "data/sl/resnet101_mnist.jsonl has 36 "
                                                 "instances, so the index must be between 0"),
    ("split_study_create", "index", "0", "index", "must be an integer"),
    ("split_study_create", "methods", [], "methods", "This list may not be empty"),
    ("split_study_create", "methods", "auto", "methods", "Expected a list of items"),
    ("split_study_create", "methods", ["auto", "magic"], "methods[1]",
     "unknown method 'magic'"),
    ("split_study_create", "methods", ["auto", "auto"], "methods[1]", "repeats 'auto'"),
    ("split_study_create", "time_limit_s", 0, "time_limit_s",
     "must be more than 0 and at most 120 seconds"),
    ("split_study_create", "time_limit_s", 600, "time_limit_s",
     "must be more than 0 and at most 120 seconds"),
    ("split_study_create", "time_limit_s", "10", "time_limit_s", "must be a finite number"),
    ("split_study_create", "switch_slots", -1, "switch_slots", "must be between 0 and 100"),
    ("split_study_create", "switch_slots", 1.5, "switch_slots", "must be an integer"),
    ("split_study_create", "seed", -1, "seed", "must be between 0 and 2147483647"),
    ("split_study_create", "seed", "x", "seed", "must be an integer"),
]


@pytest.mark.parametrize("name", sorted(ENDPOINTS))
def test_the_valid_body_is_accepted(api, name):
    endpoint = ENDPOINTS[name](api)
    answer = getattr(endpoint.client, endpoint.method)(endpoint.url, endpoint.body,
                                                       format="json")
    assert answer.status_code == endpoint.ok, answer.json()


@pytest.mark.parametrize(("name", "field", "value", "named", "reason"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_a_wrong_value_is_a_400_naming_the_field(api, name, field, value, named, reason):
    endpoint = ENDPOINTS[name](api)
    body = dict(endpoint.body)
    if value is MISSING:
        del body[field]
    elif callable(value):  # a change to the valid value
        body[field] = value(body[field])
    else:
        body[field] = value
    answer = getattr(endpoint.client, endpoint.method)(endpoint.url, body, format="json")
    assert answer.status_code == 400, answer.content
    errors = answer.json()["errors"]
    assert errors[0]["field"] == named
    assert errors[0]["reason"].startswith(reason), errors[0]["reason"]
    assert answer.json()["detail"] == f"{named}: {errors[0]['reason']}"


def test_every_field_of_every_endpoint_has_a_case(api):
    covered = {(c[0], c[1]) for c in CASES}
    fields = {(name, f) for name, make in ENDPOINTS.items() for f in make(api).body}
    assert fields - covered == set()


@pytest.mark.parametrize("name", sorted(ENDPOINTS))
def test_a_body_that_is_not_an_object_is_a_400(api, name):
    endpoint = ENDPOINTS[name](api)
    answer = getattr(endpoint.client, endpoint.method)(endpoint.url, [1, 2], format="json")
    assert answer.status_code == 400
    assert answer.json()["errors"] == [{"field": "body", "reason": "must be a JSON object"}]


@pytest.mark.parametrize("name", sorted(ENDPOINTS))
def test_a_body_that_is_not_json_is_a_400(api, name):
    endpoint = ENDPOINTS[name](api)
    answer = getattr(endpoint.client, endpoint.method)(endpoint.url, "{nope",
                                                       content_type="application/json")
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == "body"
    assert answer.json()["errors"][0]["reason"].startswith("JSON parse error")
