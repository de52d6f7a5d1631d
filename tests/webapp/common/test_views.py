"""Errors outside DRF's views are JSON too under /api/."""

import pytest
from django.test import override_settings

from tests.webapp.factories import DeviceFactory

pytestmark = pytest.mark.django_db


def test_an_unknown_api_path_is_a_json_404(api):
    answer = api.get("/api/nothing-here/")
    assert answer.status_code == 404
    assert answer.json() == {"detail": "no API endpoint at /api/nothing-here/"}


def test_an_unknown_page_elsewhere_is_djangos_page(api):
    answer = api.get("/nothing-here/")
    assert answer.status_code == 404 and answer["Content-Type"].startswith("text/html")


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=2**20)
def test_a_body_over_the_size_limit_is_a_json_400_naming_the_body(agent):
    answer = agent(DeviceFactory()).post("/api/agent/heartbeat/", {"pad": "x" * 2**21},
                                         format="json")
    assert answer.status_code == 400
    assert answer.json()["errors"] == [{"field": "body", "reason": "is larger than 1 MiB: send "
                                                                   "it in smaller batches"}]


def test_a_crash_in_an_api_view_is_a_json_500(api, monkeypatch):
    from webapp.devices import selectors

    def crash():
        raise RuntimeError("boom")

    monkeypatch.setattr(selectors, "model_spec_list", crash)
    api.raise_request_exception = False
    answer = api.get("/api/model-specs/")
    assert answer.status_code == 500
    assert answer.json() == {"detail": "internal server error (logged on the server)"}
