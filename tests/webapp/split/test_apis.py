"""The split-learning REST API: shared instances, studies (create, list, detail), the
comparison and a schedule's Gantt; 400s naming the field, 401/403 without a session."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.webapp.split.factories import (
    MNIST,
    SplitScheduleFactory,
    SplitStudyFactory,
    instance_document,
)
from webapp.split.models import SplitStudy

pytestmark = pytest.mark.django_db

BODY = {"name": "mnist K5", "file": MNIST, "index": 0,
        "methods": ["balanced-greedy", "random-fcfs"], "time_limit_s": 2.0}


def test_create_then_list_detail_compare_and_gantt(api, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        answer = api.post("/api/split/studies/", BODY, format="json")
    assert answer.status_code == 201, answer.json()
    created = answer.json()
    assert created["source"] == f"{MNIST}#0" and created["created_by"] == user.username
    assert (created["clients"], created["helpers"]) == (5, 2)
    assert [s["method"] for s in created["schedules"]] == ["balanced-greedy", "random-fcfs"]
    assert {s["status"] for s in created["schedules"]} == {"pending"}  # as committed
    assert created["instance"]["name"] == "resnet101-mnist-K5-H2-s1-slots100"
    study = created["id"]

    listed = api.get("/api/split/studies/").json()
    assert [s["id"] for s in listed] == [study]
    assert listed[0]["status"] == "done" and "instance" not in listed[0]
    assert "schedule" not in listed[0]["schedules"][0]

    detail = api.get(f"/api/split/studies/{study}/").json()
    assert detail["status"] == "done"
    for schedule in detail["schedules"]:
        assert schedule["status"] == "done"
        assert schedule["schedule"]["makespan"] == schedule["makespan"]

    compare = api.get(f"/api/split/studies/{study}/compare/").json()
    makespans = [r["makespan"] for r in compare["rows"]]
    assert makespans == sorted(makespans) and compare["best"] == compare["rows"][0]["schedule"]
    assert "has the shortest makespan" in compare["reason"]

    best = compare["best"]
    gantt = api.get(f"/api/split/studies/{study}/schedules/{best}/gantt/").json()
    assert len(gantt["rows"]) == 2 + 5 and gantt["makespan"] == makespans[0]
    assert {b["kind"] for b in gantt["bars"]} >= {"forward", "backward", "client-finish"}


def test_an_uploaded_instance_with_a_bad_entry_is_a_400_naming_its_path(api):
    body = {k: v for k, v in BODY.items() if k not in ("file", "index")}
    body["instance"] = instance_document(lp=[[1, 1], [1, -2], [1, 1]])
    answer = api.post("/api/split/studies/", body, format="json")
    assert answer.status_code == 400
    assert answer.json() == {"detail": "instance.lp[1][1]: must be at least 0",
                             "errors": [{"field": "instance.lp[1][1]",
                                         "reason": "must be at least 0"}]}
    assert not SplitStudy.objects.exists()


@pytest.mark.parametrize(("change", "field", "reason"), [
    ({"methods": ["auto", "simplex"]}, "methods[1]", "unknown method 'simplex'"),
    ({"time_limit_s": 0}, "time_limit_s", "must be more than 0 and at most 120 seconds"),
    ({"index": 99}, "index", f"{MNIST} has 36 instances"),
    ({"name": ""}, "name", "This field may not be blank."),
])
def test_a_bad_field_is_a_400_naming_it(api, change, field, reason):
    answer = api.post("/api/split/studies/", {**BODY, **change}, format="json")
    assert answer.status_code == 400
    error = answer.json()["errors"][0]
    assert error["field"] == field and error["reason"].startswith(reason)


def test_the_shared_instances_are_listed(api):
    instances = api.get("/api/split/instances/").json()
    assert len(instances) == 72
    assert {"file": MNIST, "index": 0, "source": f"{MNIST}#0",
            "name": "resnet101-mnist-K5-H2-s1-slots100", "clients": 5, "helpers": 2} in instances


def test_unknown_study_and_a_gantt_not_computed_yet(api):
    assert api.get("/api/split/studies/999/").json() == {"detail": "split study 999 does not "
                                                                   "exist"}
    pending = SplitScheduleFactory(status="pending", makespan=None)
    answer = api.get(f"/api/split/studies/{pending.study_id}/schedules/{pending.pk}/gantt/")
    assert answer.status_code == 409
    assert answer.json()["detail"] == (f"schedule {pending.pk} (balanced-greedy) is pending: "
                                       "it has no Gantt yet")
    other = SplitStudyFactory()
    answer = api.get(f"/api/split/studies/{other.pk}/schedules/{pending.pk}/gantt/")
    assert answer.status_code == 404


def urls() -> list[str]:
    return ["/api/split/instances/", "/api/split/studies/", "/api/split/studies/1/",
            "/api/split/studies/1/compare/", "/api/split/studies/1/schedules/1/gantt/"]


@pytest.mark.parametrize("url", urls())
def test_without_a_session_every_endpoint_is_a_401(anon, url):
    answer = anon.get(url)
    assert answer.status_code == 401
    assert answer.json() == {"detail": "Authentication credentials were not provided."}


def test_creating_needs_the_session_and_its_csrf_token(anon, user):
    assert anon.post("/api/split/studies/", BODY, format="json").status_code == 401
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    answer = client.post("/api/split/studies/", BODY, format="json")
    assert answer.status_code == 403
    assert answer.json()["detail"].startswith("CSRF Failed")
    assert not SplitStudy.objects.exists()


def test_the_openapi_schema_describes_the_split_api_without_warnings():
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    GENERATOR_STATS.reset()
    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert not GENERATOR_STATS, "drf-spectacular warned (run manage.py spectacular --validate)"
    assert set(schema["paths"]) >= {
        "/api/split/instances/", "/api/split/studies/", "/api/split/studies/{study_id}/",
        "/api/split/studies/{study_id}/compare/",
        "/api/split/studies/{study_id}/schedules/{schedule_id}/gantt/"}
    create = schema["paths"]["/api/split/studies/"]["post"]
    ref = create["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    fields = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
    assert set(fields) == {"name", "instance", "file", "index", "methods", "time_limit_s",
                           "switch_slots", "seed"}
