"""Nothing the dashboard serves makes a browser fetch from outside this server: no template or
static file of the project names an http(s) URL (XML namespaces aside), no rendered page links
one, and the one vendored file is plotly.js exactly as npm ships it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from django.test import Client

from tests.conftest import ROOT
from tests.webapp.factories import LayerProfileFactory, PlanFactory, RunFactory

pytestmark = pytest.mark.django_db

VENDOR = ROOT / "webapp" / "dashboard" / "static" / "vendor"
PLOTLY_SHA256 = "99784e3abfb07b142a15e521a439e6d9addceadb3f79553fd24c72774f0649ba"
URL = re.compile(r"https?://[^\s\"'<>)]+", re.I)
# identifiers that look like URLs but are never fetched
NAMESPACES = ("http://www.w3.org/2000/svg",)


def served_files() -> list[Path]:
    """Every template and static file of the project's apps, the vendored bundle aside."""
    found = []
    for folder in ("templates", "static"):
        for app in sorted((ROOT / "webapp").glob(f"*/{folder}")):
            found += [p for p in sorted(app.rglob("*"))
                      if p.is_file() and VENDOR not in p.parents]
    return found


def test_the_project_serves_templates_and_static_files():
    names = {p.name for p in served_files()}
    assert {"base.html", "run.html", "run.js", "live.js", "dashboard.css"} <= names


@pytest.mark.parametrize("path", served_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_template_or_static_file_names_an_outside_url(path: Path):
    urls = [u for u in URL.findall(path.read_text(errors="replace")) if u not in NAMESPACES]
    assert urls == []


def test_the_vendored_plotly_is_the_npm_file_with_its_license():
    assert sorted(p.name for p in VENDOR.rglob("*") if p.is_file()) == [
        "LICENSE", "README.txt", "plotly-basic.min.js"]
    bundle = (VENDOR / "plotly" / "plotly-basic.min.js").read_bytes()
    assert hashlib.sha256(bundle).hexdigest() == PLOTLY_SHA256
    assert "MIT License" in (VENDOR / "plotly" / "LICENSE").read_text()


def test_no_rendered_page_links_outside_the_server(browser: Client):
    profile = LayerProfileFactory()
    run = RunFactory(devices=[profile.device])
    PlanFactory(run=run)
    pages = ["/", "/devices/", "/devices/?add=1", f"/devices/{profile.device.pk}/", "/runs/",
             "/runs/new/", f"/runs/{run.pk}/", "/no-such-page/"]
    for page in pages:
        html = browser.get(page).content.decode()
        html += browser.post("/devices/", {"name": "pi"}).content.decode()  # the commands
        links = re.findall(r'(?:src|href|action)="([^"]*)"', html)
        links += re.findall(r"url\(([^)]*)\)", html)
        outside = [u for u in links if re.match(r"^(https?:)?//", u)]
        assert links and outside == [], page
        # the one absolute URL a page shows is this server's, in the agent's command
        assert set(URL.findall(html)) <= {"http://testserver"}, page
    assert Client().get("/login/").status_code == 200
    assert not URL.findall(Client().get("/login/").content.decode())
