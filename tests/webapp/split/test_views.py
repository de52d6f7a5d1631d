"""The split-learning pages: login first, the studies with the new-study form (its errors next
to the fields they name), and a study's comparison with what its script needs."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from tests.webapp.factories import UserFactory
from tests.webapp.split.factories import (
    MNIST,
    SplitScheduleFactory,
    SplitStudyFactory,
    instance_document,
)
from webapp.split.models import SplitSchedule, SplitStudy

pytestmark = pytest.mark.django_db

FORM = {"name": "mnist K5", "source": "shared", "shared": f"{MNIST}#0",
        "methods": ["balanced-greedy", "random-fcfs"], "time_limit_s": "2", "switch_slots": "0",
        "seed": "0"}


@pytest.fixture
def browser() -> Client:
    client = Client()
    client.force_login(UserFactory())
    return client


def field_errors(html: str, field: str) -> list[str]:
    return [unescape(e) for e in
            re.findall(rf'<div class="field-error" data-for="{field}">(.*?)</div>', html)]


@pytest.mark.parametrize("path", ["/split/", "/split/1/"])
def test_the_pages_ask_for_the_login_first(client: Client, path):
    answer = client.get(path)
    assert answer.status_code == 302 and answer["Location"] == f"/login/?next={path}"


def test_the_studies_page_offers_every_shared_instance_and_method(browser):
    html = browser.get("/split/").content.decode()
    assert "No studies yet" in html
    assert f'<option value="{MNIST}#0">#0 · resnet101-mnist-K5-H2-s1-slots100 · 5 clients, ' \
           '2 helpers</option>' in html
    assert html.count("<option value=\"data/sl/") == 72
    for method in ("exact", "admm", "balanced-greedy", "random-fcfs", "auto"):
        assert f'id="method-{method}"' in html
    assert re.search(r'class="nav-link active" href="/split/">Split learning</a>', html)


def test_creating_a_study_through_the_form_goes_to_its_page(browser):
    answer = browser.post("/split/", FORM)
    study = SplitStudy.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/split/{study.pk}/"
    assert study.source == f"{MNIST}#0" and study.time_limit_s == 2.0
    assert [s.method for s in study.schedules.order_by("id")] == ["balanced-greedy",
                                                                  "random-fcfs"]


def test_an_uploaded_instance_is_studied(browser):
    upload = SimpleUploadedFile("tiny.json", json.dumps(instance_document()).encode(),
                                content_type="application/json")
    answer = browser.post("/split/", {**FORM, "source": "upload", "upload": upload})
    assert answer.status_code == 302
    assert SplitStudy.objects.get().source == "uploaded"


@pytest.mark.parametrize(("changes", "field", "error"), [
    ({"time_limit_s": "0"}, "time_limit_s", "must be more than 0 and at most 120 seconds"),
    ({"time_limit_s": "soon"}, "time_limit_s", "must be a finite number"),
    ({"switch_slots": "500"}, "switch_slots", "must be between 0 and 100"),
    ({"seed": "-4"}, "seed", "must be between 0 and 2147483647"),
    ({"name": ""}, "name", "This field may not be blank."),
    ({"methods": []}, "methods", "This list may not be empty."),
    ({"methods": ["auto", "simplex"]}, "methods",
     "methods[1]: unknown method 'simplex'; known: exact, admm, balanced-greedy, random-fcfs, "
     "auto"),
    ({"shared": ""}, "instance", "choose a shared instance, or upload one"),
    ({"shared": f"{MNIST}#40"}, "instance",
     f"{MNIST} has 36 instances, so the index must be between 0 and 35"),
    ({"source": "upload"}, "instance", "choose a JSON file to upload, or a shared instance"),
])
def test_a_refused_form_shows_the_reason_next_to_the_field(browser, changes, field, error):
    answer = browser.post("/split/", {**FORM, **changes})
    assert answer.status_code == 200
    html = answer.content.decode()
    assert field_errors(html, field) == [error]
    assert "The study was not created" in html
    assert 'value="mnist K5"' in html or field == "name"  # the rest stays as typed
    assert not SplitStudy.objects.exists()


@pytest.mark.parametrize(("content", "error"), [
    (b"{nope", "the file is not valid JSON: Expecting property name enclosed in double quotes "
               "at line 1 column 2"),
    (json.dumps(instance_document(pp=[[3, 4], [4, 3]])).encode(),
     "instance.pp: has 2 rows but there are 3 clients"),
    (b"[1, 2]", "must be a JSON object"),
])
def test_a_bad_upload_is_explained_next_to_the_instance(browser, content, error):
    upload = SimpleUploadedFile("mine.json", content, content_type="application/json")
    answer = browser.post("/split/", {**FORM, "source": "upload", "upload": upload})
    assert field_errors(answer.content.decode(), "instance") == [error]
    assert 'id="id_source_upload" checked' in answer.content.decode()


def test_the_studies_table_shows_each_study_with_its_best(browser):
    study = SplitStudyFactory(name="lab bench")
    SplitScheduleFactory(study=study, method="auto", makespan=31)
    SplitScheduleFactory(study=study, method="random-fcfs", makespan=40)
    html = browser.get("/split/").content.decode()
    row = re.search(rf'<tr data-study="{study.pk}">(.*?)</tr>', html, re.S).group(1)
    assert "lab bench" in row and "31 slots" in row and "(auto)" in row
    assert 'badge-done">done' in row and "3 × 2" in row


def test_a_study_page_shows_the_comparison_and_what_its_script_polls(browser):
    study = SplitStudyFactory(name="tiny study")
    best = SplitScheduleFactory(study=study, method="auto", makespan=10, lower_bound=10,
                                solver_s=0.25)
    worse = SplitScheduleFactory(study=study, method="random-fcfs", makespan=13)
    failed = SplitScheduleFactory(study=study, method="admm", status="failed", makespan=None,
                                  error="no assignment of the clients fits")
    pending = SplitScheduleFactory(study=study, method="exact", status="pending", makespan=None)
    html = browser.get(f"/split/{study.pk}/").content.decode()
    assert "tiny study" in html and 'id="study-status">running' in html
    assert "auto has the shortest makespan (10 slots, 1.0 s), 23% shorter than random-fcfs" in html
    rows = re.findall(r'<tr data-schedule="(\d+)"', html)
    assert rows == [str(best.pk), str(worse.pk), str(failed.pk), str(pending.pk)]
    assert "+30%" in html and "250 ms" in html and "no assignment of the clients fits" in html
    config = json.loads(re.search(r'<script id="split-config" type="application/json">(.*?)'
                                  r"</script>", html, re.S).group(1))
    assert config["poll_ms"] == 2000
    assert config["statuses"][str(pending.pk)] == SplitSchedule.Status.PENDING
    assert config["urls"] == {
        "detail": f"/api/split/studies/{study.pk}/",
        "compare": f"/api/split/studies/{study.pk}/compare/",
        "gantt": f"/api/split/studies/{study.pk}/schedules/{{schedule}}/gantt/"}
    assert "/static/vendor/plotly.min.js" in html and "split/split.js" in html


def test_an_unknown_study_is_a_404(browser):
    assert browser.get("/split/999/").status_code == 404


def test_no_split_page_links_outside_the_server(browser):
    study = SplitStudyFactory()
    SplitScheduleFactory(study=study)
    for page in ("/split/", f"/split/{study.pk}/"):
        html = browser.get(page).content.decode()
        links = re.findall(r'(?:src|href|action)="([^"]*)"', html)
        assert links and [u for u in links if re.match(r"^(https?:)?//", u)] == [], page
        assert not re.findall(r"https?://", html), page


def test_the_admin_lists_studies_and_schedules(admin_client):
    schedule = SplitScheduleFactory()
    assert "study" in admin_client.get("/admin/split/splitstudy/").content.decode()
    answer = admin_client.get(f"/admin/split/splitstudy/{schedule.study_id}/change/")
    assert answer.status_code == 200 and "balanced-greedy" in answer.content.decode()
    assert admin_client.get("/admin/split/splitschedule/").status_code == 200


@pytest.mark.parametrize(("value", "shown"), [(None, "–"), (0.0, "0%"), (0.079, "+7.9%"),
                                              (0.3, "+30%"), (1.0, "+100%")])
def test_a_gap_is_shown_as_a_signed_percentage(value, shown):
    from webapp.split.templatetags.split import gap

    assert gap(value) == shown
