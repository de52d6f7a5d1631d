"""The OpenAPI schema and its documentation page, served without a CDN."""

import re

import pytest
from django.contrib.staticfiles import finders

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
