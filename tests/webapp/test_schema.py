"""The OpenAPI schema and its documentation page, served without a CDN; the schema generates
without a warning, and every endpoint documents the errors it gives (that it gives no other
and that its answers match: test_schema_answers)."""

import re

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from drf_spectacular.drainage import GENERATOR_STATS

from tests.webapp.openapi import generate

pytestmark = pytest.mark.django_db


def test_the_schema_lists_the_api_and_both_ways_to_authenticate(anon):
    answer = anon.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert answer.status_code == 200
    schema = answer.json()
    for path in ("/api/agent/enrol/", "/api/runs/{run_id}/plan/",
                 "/api/runs/{run_id}/plans/compare/", "/api/agent/profiles/"):
        assert path in schema["paths"]
    assert set(schema["components"]["securitySchemes"]) == {"session", "deviceKey"}
    enrol = schema["paths"]["/api/agent/enrol/"]["post"]
    assert set(enrol["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")
               ) >= {"EnrolInputRequest"}


def test_a_plan_documents_its_training_curve(anon):
    schema = anon.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    components = schema["components"]["schemas"]
    training = components["PlanDetailOutput"]["properties"]["training"]["$ref"].rsplit("/", 1)[1]
    curve = components[training]["properties"]
    assert set(curve) == {"episodes", "best_reward", "mean_reward"}
    assert curve["best_reward"]["items"] == {"type": "number", "format": "double",
                                             "nullable": True}


def test_the_replica_endpoint_documents_its_raw_bodies(anon):
    schema = anon.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    replicas = schema["paths"]["/api/agent/runs/{run_id}/replicas/"]
    assert {"get", "put"} <= set(replicas)
    for method in ("get", "put"):
        assert {p["name"] for p in replicas[method]["parameters"]} >= {
            "first", "last", "applied"}
        assert replicas[method]["security"] == [{"deviceKey": []}]
    assert set(replicas["put"]["requestBody"]["content"]) == {"application/octet-stream"}
    assert set(replicas["get"]["responses"]["200"]["content"]) == {"application/octet-stream"}
    assert "404" in replicas["get"]["responses"]
    run = schema["components"]["schemas"]["RunOutput"]["properties"]
    assert {"chain_every", "global_every", "repartition_after", "repartition_every",
            "generation"} <= set(run)


def test_the_documentation_page_loads_everything_from_this_server(anon):
    answer = anon.get("/api/docs/")
    assert answer.status_code == 200
    html = answer.content.decode()
    urls = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert urls and not re.search(r"https?://", html.split("<body")[0] + " ".join(urls))
    for url in urls:
        assert url.startswith("/static/drf_spectacular_sidecar/")
        assert finders.find(url.removeprefix("/static/")), url


def test_the_schema_generates_without_a_warning_and_is_valid_openapi(tmp_path):
    GENERATOR_STATS.reset()
    # raises (SchemaGenerationError) on any warning or error, and on an invalid schema
    call_command("spectacular", "--validate", "--fail-on-warn",
                 "--file", str(tmp_path / "schema.yaml"))
    assert (tmp_path / "schema.yaml").stat().st_size > 0


ERROR_BODIES = {"400": {"InvalidOutput"}, "401": {"ErrorOutput"}, "403": {"ErrorOutput"},
                "404": {"ErrorOutput", "ReplicaMissing"}, "409": {"ConflictOutput"}}


def test_every_endpoint_documents_the_errors_it_can_give():
    """401 where a session or a device key is needed, 403 where a session writes (its CSRF
    check) or only staff may, 404 where the path names an object, 400 where there is input;
    each with the body webapp.common.errors writes."""
    missing = []
    for path, operations in generate()["paths"].items():
        for method, operation in operations.items():
            schemes = {name for s in operation.get("security", ()) for name in s}
            places = {p["in"] for p in operation.get("parameters", ())}
            needed = set()
            if schemes:
                needed.add("401")
            if "session" in schemes and method in ("post", "put", "patch", "delete"):
                needed.add("403")
            if "path" in places:
                needed.add("404")
            if "query" in places or "requestBody" in operation:
                needed.add("400")
            responses = operation["responses"]
            missing += [f"{method.upper()} {path} {s}" for s in sorted(needed - set(responses))]
            for status, bodies in ERROR_BODIES.items():
                for content in responses.get(status, {}).get("content", {}).values():
                    name = content["schema"]["$ref"].rsplit("/", 1)[1]
                    assert name in bodies, (method, path, status, name)
    assert missing == []
