"""What the API really answers is what its OpenAPI schema says: every endpoint is called, for
its successes and for the errors it gives (400, 401, 403, 404, 409), and each answer's status,
media type and body are checked against the schema's response for that path, method and
status (tests.webapp.openapi): a null in a field not declared nullable, an undocumented status
or an undocumented property fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.webapp.factories import (
    DeviceFactory,
    EnrollmentTokenFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    PlanFactory,
    RunFactory,
)
from tests.webapp.openapi import Schema, generate
from tests.webapp.split.factories import MNIST, SplitScheduleFactory, SplitStudyFactory
from webapp.devices.models import Device
from webapp.runs.models import Plan, Run, TimelineEvent
from webapp.split.models import SplitSchedule

pytestmark = pytest.mark.django_db

CHANNEL = "specific.test!agent"  # a connected agent's control channel
WRONG_KEY = "Device dev-nope:edk_wrong"


class Calls:
    """Calls the API, checks each answer's status is the one meant and records it with what
    the schema says is wrong with it."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.problems: list[str] = []
        self.answered: set[tuple[str, str, int]] = set()

    def __call__(self, client: APIClient, method: str, path: str, data: Any = None, *,
                 expect: int, **extra: Any) -> Any:
        if method == "get":
            answer = client.get(path, data, **extra)
        elif "content_type" in extra:
            answer = getattr(client, method)(path, data, **extra)
        else:
            answer = getattr(client, method)(path, data, format="json", **extra)
        content_type = answer.get("Content-Type", "")
        body = answer.json() if content_type.startswith("application/json") else answer.content
        assert answer.status_code == expect, (method, path, answer.status_code, body)
        template = self.schema.template(path)
        self.answered.add((method, template, answer.status_code))
        self.problems.extend(self.schema.problems(method, path, answer.status_code,
                                                  content_type, body))
        return body


def _runs(call: Calls, api: APIClient, anon: APIClient) -> None:
    spec = ModelSpecFactory()
    devices = [DeviceFactory(last_heartbeat_at=None), DeviceFactory()]
    draft = RunFactory(model_spec=spec, devices=devices)  # no plan, never started
    PlanFactory(run=draft, algorithm="pipedream", status=Plan.Status.PENDING, stages=None,
                period_s=None, throughput_sps=None, memory_ok=None, planner_s=None)
    PlanFactory(run=draft, algorithm="ftpipehd")  # done: figures, no simulation
    finished = RunFactory(model_spec=spec, devices=devices, state=Run.State.FINISHED)
    running = RunFactory(model_spec=spec, devices=devices, state=Run.State.RUNNING)

    call(api, "get", "/api/runs/", expect=200)
    call(api, "get", "/api/runs/", {"state": "bogus"}, expect=400)
    call(anon, "get", "/api/runs/", expect=401)
    call(api, "post", "/api/runs/", {"name": "r", "model_spec": spec.pk,
                                     "devices": [d.pk for d in devices],
                                     "algorithms": ["ftpipehd"]}, expect=201)
    call(api, "post", "/api/runs/", {"devices": []}, expect=400)
    call(api, "get", f"/api/runs/{draft.pk}/", expect=200)
    call(api, "get", "/api/runs/999999/", expect=404)
    call(api, "post", f"/api/runs/{finished.pk}/plan/", {}, expect=409)
    call(api, "post", f"/api/runs/{draft.pk}/plan/", {"algorithms": ["nope"]}, expect=400)
    call(api, "post", f"/api/runs/{draft.pk}/start/", {"plan": 999999}, expect=400)
    call(api, "post", f"/api/runs/{draft.pk}/start/", {}, expect=409)
    call(api, "post", f"/api/runs/{draft.pk}/pause/", expect=409)
    call(api, "post", f"/api/runs/{running.pk}/pause/", expect=200)
    call(api, "post", f"/api/runs/{finished.pk}/stop/", expect=409)
    call(api, "post", "/api/runs/999999/stop/", expect=404)
    call(api, "get", f"/api/runs/{draft.pk}/plans/", expect=200)
    call(api, "get", "/api/runs/999999/plans/", expect=404)
    call(api, "get", f"/api/runs/{draft.pk}/plans/compare/", expect=200)
    TimelineEvent.objects.bulk_create(
        TimelineEvent(run=running, device=d.uid, stage=k, kind="forward", microbatch=m,
                      version=0, start=0.1 * m, end=0.1 * m + 0.05)
        for k, d in enumerate(devices) for m in range(4))
    call(api, "get", f"/api/runs/{running.pk}/timeline/", expect=200)
    call(api, "get", f"/api/runs/{running.pk}/timeline/", {"max_events": 0, "max_bars": 2},
         expect=200)
    call(api, "get", f"/api/runs/{draft.pk}/timeline/", expect=200)  # no events: newest null
    call(api, "get", f"/api/runs/{running.pk}/timeline/", {"start": 2, "end": 1}, expect=400)
    call(anon, "get", f"/api/runs/{running.pk}/timeline/", expect=401)
    call(api, "get", "/api/runs/999999/timeline/", expect=404)
    call(api, "get", "/api/runs/999999/plans/compare/", expect=404)
    call(api, "post", f"/api/runs/{RunFactory(model_spec=spec, devices=devices).pk}/plan/", {},
         expect=202)
    planning = RunFactory(model_spec=spec, devices=devices, state=Run.State.PLANNING)
    call(api, "post", f"/api/runs/{planning.pk}/stop/", expect=200)

    pending = draft.plans.get(algorithm="pipedream")
    base = f"/api/dashboard/runs/{draft.pk}"
    call(api, "get", f"{base}/plans/layouts/", expect=200)
    call(api, "get", "/api/dashboard/runs/999999/plans/layouts/", expect=404)
    call(api, "get", f"{base}/plans/{pending.pk}/timeline/", expect=409)
    call(api, "get", f"{base}/plans/{pending.pk}/timeline/", {"batches": 0}, expect=400)
    call(api, "get", f"{base}/plans/999999/timeline/", expect=404)
    call(api, "get", f"{base}/planned/", {"start": 0, "end": 1}, expect=409)
    call(api, "get", f"{base}/planned/", {"start": 2, "end": 1}, expect=400)
    call(api, "get", "/api/dashboard/runs/999999/planned/", {"start": 0, "end": 1}, expect=404)


def _devices(call: Calls, api: APIClient, staff_api: APIClient, anon: APIClient,
             user: Any) -> None:
    spec = ModelSpecFactory()
    offline = DeviceFactory(last_heartbeat_at=None, status=Device.Status.OFFLINE)
    connected = DeviceFactory(control_channel=CHANNEL)
    peer = DeviceFactory(control_channel=CHANNEL + "2")
    LayerProfileFactory(device=offline, model_spec=spec)
    token = EnrollmentTokenFactory(created_by=None)

    call(api, "get", "/api/enrollment-tokens/", expect=200)
    call(anon, "get", "/api/enrollment-tokens/", expect=401)
    call(api, "post", "/api/enrollment-tokens/", {"label": "x"}, expect=403)
    call(staff_api, "post", "/api/enrollment-tokens/", {"max_uses": 0}, expect=400)
    call(staff_api, "post", "/api/enrollment-tokens/", {"label": "x"}, expect=201)
    call(api, "post", f"/api/enrollment-tokens/{token.pk}/revoke/", expect=403)
    call(staff_api, "post", "/api/enrollment-tokens/999999/revoke/", expect=404)
    call(staff_api, "post", f"/api/enrollment-tokens/{token.pk}/revoke/", expect=200)

    call(api, "get", "/api/devices/", expect=200)
    call(api, "get", "/api/devices/", {"status": "bogus"}, expect=400)
    call(api, "get", f"/api/devices/{offline.pk}/", expect=200)
    call(api, "get", "/api/devices/999999/", expect=404)
    call(api, "patch", f"/api/devices/{offline.pk}/", {"name": "renamed"}, expect=200)
    call(api, "patch", f"/api/devices/{offline.pk}/", {"name": 3}, expect=400)
    call(api, "patch", "/api/devices/999999/", {"name": "x"}, expect=404)
    call(api, "post", f"/api/devices/{offline.pk}/profile/", {"model_spec": spec.pk},
         expect=409)
    call(api, "post", f"/api/devices/{offline.pk}/profile/", {}, expect=400)
    call(api, "post", f"/api/devices/{connected.pk}/profile/", {"model_spec": spec.pk},
         expect=202)
    call(api, "post", "/api/devices/999999/profile/", {"model_spec": spec.pk}, expect=404)
    call(api, "post", f"/api/devices/{connected.pk}/stop-agent/", expect=403)
    call(staff_api, "post", f"/api/devices/{offline.pk}/stop-agent/", expect=409)
    call(staff_api, "post", "/api/devices/999999/stop-agent/", expect=404)
    call(staff_api, "post", f"/api/devices/{connected.pk}/stop-agent/", expect=202)
    call(api, "post", f"/api/devices/{offline.pk}/restart-agent/", expect=403)
    call(staff_api, "post", "/api/devices/999999/restart-agent/", expect=404)
    call(staff_api, "post", f"/api/devices/{connected.pk}/restart-agent/", expect=409)
    call(staff_api, "post", f"/api/devices/{connected.pk}/emulate/", {"slowdown": 0.5},
         expect=400)
    call(staff_api, "post", f"/api/devices/{offline.pk}/emulate/", {"slowdown": 2.0},
         expect=409)
    call(staff_api, "post", "/api/devices/999999/emulate/", {"slowdown": 2.0}, expect=404)
    call(staff_api, "post", f"/api/devices/{connected.pk}/emulate/", {"slowdown": 2.0},
         expect=202)
    call(api, "post", f"/api/devices/{connected.pk}/emulate/", {"slowdown": 2.0}, expect=403)
    call(api, "get", "/api/links/", expect=200)
    call(api, "post", "/api/links/", {"devices": []}, expect=400)
    call(api, "post", "/api/links/", {"devices": [offline.pk, connected.pk]}, expect=409)
    call(api, "post", "/api/links/", {"devices": [peer.pk, connected.pk]}, expect=202)
    call(api, "get", "/api/model-specs/", expect=200)
    call(api, "post", "/api/model-specs/", {"model": "mlp"}, expect=400)
    call(api, "post", "/api/model-specs/", {"model": "mlp", "dataset": "digits",
                                            "batch_size": 7}, expect=201)
    call(api, "post", "/api/model-specs/", {"model": "mlp", "dataset": "digits",
                                            "batch_size": 7}, expect=200)
    call(api, "get", "/api/profiles/", expect=200)
    call(api, "get", "/api/profiles/", {"device": 0}, expect=400)
    profile = offline.profiles.get()
    call(api, "get", f"/api/profiles/{profile.pk}/", expect=200)
    call(api, "get", "/api/profiles/999999/", expect=404)
    call(staff_api, "post", f"/api/devices/{offline.pk}/retire/", expect=200)
    call(staff_api, "post", "/api/devices/999999/retire/", expect=404)
    call(api, "post", f"/api/devices/{connected.pk}/retire/", expect=403)
    # a session's writes need its CSRF token
    csrf = APIClient(enforce_csrf_checks=True)
    csrf.force_login(user)
    call(csrf, "patch", f"/api/devices/{connected.pk}/", {"name": "x"}, expect=403)


def _agents(call: Calls, agent: Callable[..., APIClient], anon: APIClient) -> None:
    spec = ModelSpecFactory()
    token = EnrollmentTokenFactory()
    device, stranger = DeviceFactory(), DeviceFactory()
    me = agent(device)
    running = RunFactory(model_spec=spec, devices=[device], state=Run.State.RUNNING)
    draft = RunFactory(model_spec=spec, devices=[device])

    enrol = {"token": token.secret, "name": "pi", "memory_bytes": 2**30, "bandwidth_bps": 1e6}
    call(anon, "post", "/api/agent/enrol/", enrol, expect=201)
    call(anon, "post", "/api/agent/enrol/", {**enrol, "token": "nope"}, expect=400)
    call(me, "get", "/api/agent/me/", expect=200)
    call(anon, "get", "/api/agent/me/", expect=401)
    call(APIClient(HTTP_AUTHORIZATION=WRONG_KEY), "get", "/api/agent/me/", expect=401)
    call(me, "post", "/api/agent/heartbeat/", {}, expect=200)
    call(me, "post", "/api/agent/heartbeat/", {"status": "retired"}, expect=400)
    call(me, "post", "/api/agent/profiles/", {"model_spec": spec.pk, "profile": {}},
         expect=400)
    call(me, "get", "/api/agent/runs/", expect=200)
    call(me, "get", f"/api/agent/runs/{draft.pk}/", expect=200)
    call(agent(stranger), "get", f"/api/agent/runs/{draft.pk}/", expect=403)
    call(me, "get", "/api/agent/runs/999999/", expect=404)
    events = f"/api/agent/runs/{running.pk}/events/"
    call(me, "post", events, {"timeline": [], "faults": [], "metrics": []}, expect=201)
    call(me, "post", events, {"metrics": "x"}, expect=400)
    call(me, "post", f"/api/agent/runs/{draft.pk}/events/", {}, expect=409)
    call(agent(stranger), "post", events, {}, expect=403)
    replicas = f"/api/agent/runs/{running.pk}/replicas/"
    layers = {"first": 0, "last": 1, "applied": 0}
    call(me, "get", replicas, layers, expect=404)
    call(me, "get", replicas, {"first": "x"}, expect=400)
    call(agent(stranger), "get", replicas, layers, expect=403)
    call(me, "get", "/api/agent/runs/999999/replicas/", layers, expect=404)
    query = "?first=0&last=1&applied=0"
    call(me, "put", f"/api/agent/runs/{draft.pk}/replicas/{query}", b"x",
         content_type="application/octet-stream", expect=409)
    call(me, "put", f"{replicas}?first=x", b"x", content_type="application/octet-stream",
         expect=400)


def _split(call: Calls, api: APIClient) -> None:
    study = SplitStudyFactory(created_by=None)
    pending = SplitScheduleFactory(study=study, status=SplitSchedule.Status.PENDING,
                                   makespan=None, solver_s=None, lower_bound=None,
                                   schedule=None, started_at=None, finished_at=None)
    call(api, "get", "/api/split/instances/", expect=200)
    call(api, "get", "/api/split/studies/", expect=200)
    call(api, "post", "/api/split/studies/", {"name": "s", "file": MNIST, "index": 0,
                                              "methods": ["balanced-greedy"]}, expect=201)
    call(api, "post", "/api/split/studies/", {"name": "s", "methods": []}, expect=400)
    call(api, "get", f"/api/split/studies/{study.pk}/", expect=200)
    call(api, "get", "/api/split/studies/999999/", expect=404)
    call(api, "get", f"/api/split/studies/{study.pk}/compare/", expect=200)
    call(api, "get", "/api/split/studies/999999/compare/", expect=404)
    gantt = f"/api/split/studies/{study.pk}/schedules/{{}}/gantt/"
    call(api, "get", gantt.format(pending.pk), expect=409)
    call(api, "get", gantt.format(999999), expect=404)


def _runs_of_several_pipelines(call: Calls, api: APIClient) -> None:
    """Split-learning and PipeLearn runs: created (and refused), a split run's progress."""
    spec = ModelSpecFactory(model="mlp", dataset="digits")
    devices = [DeviceFactory() for _ in range(3)]
    for device in devices:
        LayerProfileFactory(device=device, model_spec=spec, layers=4)
    split = {"name": "sl", "model_spec": spec.pk, "clients": [devices[0].pk, devices[1].pk],
             "helpers": [devices[2].pk], "algorithms": ["balanced-greedy"], "sigma1": 0,
             "sigma2": 1}
    run = call(api, "post", "/api/runs/split/", split, expect=201)
    call(api, "post", "/api/runs/split/", {**split, "sigma2": 3}, expect=400)
    call(api, "get", f"/api/runs/{run['id']}/split/", expect=200)
    call(api, "get", f"/api/runs/{RunFactory().pk}/split/", expect=409)
    call(api, "get", "/api/runs/999999/split/", expect=404)
    pipelearn = {"name": "pl", "model_spec": spec.pk, "server": devices[2].pk,
                 "clients": [devices[0].pk, devices[1].pk]}
    call(api, "post", "/api/runs/pipelearn/", pipelearn, expect=201)
    call(api, "post", "/api/runs/pipelearn/", {**pipelearn, "clients": []}, expect=400)


def test_every_answer_of_every_endpoint_is_what_the_schema_says(
        user: Any, api: APIClient, staff_api: APIClient, anon: APIClient,
        agent: Callable[..., APIClient]) -> None:
    # Prepare
    schema = Schema(generate())
    call = Calls(schema)
    # Execute
    _runs(call, api, anon)
    _devices(call, api, staff_api, anon, user)
    _agents(call, agent, anon)
    _split(call, api)
    _runs_of_several_pipelines(call, api)
    # Assert
    assert not call.problems, "\n".join(call.problems)
    operations = {(m, p) for p, ops in schema.document["paths"].items() for m in ops}
    assert operations - {(m, p) for m, p, _ in call.answered} == set()
    assert {s for _, _, s in call.answered} >= {200, 201, 202, 400, 401, 403, 404, 409}


def test_the_validator_refuses_a_null_an_undocumented_status_and_property() -> None:
    schema = Schema(generate())
    run = "/api/runs/1/"
    assert schema.problems("get", run, 200, "application/json", {"id": None}) != []
    assert schema.problems("get", run, 418, "application/json", {}) == [
        f"GET /api/runs/{{run_id}}/ 418: undocumented status (documented: "
        f"{', '.join(sorted(schema.operation('get', run)['responses']))})"]
    body = schema.problems("get", "/api/model-specs/", 200, "application/json",
                           [{"id": 1, "model": "m", "dataset": "d", "batch_size": 1, "x": 2}])
    assert body == ["GET /api/model-specs/ 200[0]: 'x' is not a documented property"]
