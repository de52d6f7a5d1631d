"""Nothing the dashboard serves makes a browser fetch from outside this server: no template or
static file of the project names an http(s) URL (XML namespaces aside), no rendered page links
one, and plotly.js is served from the pinned plotly package, byte for byte, with no copy of it
in the tree."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import plotly
import pytest
from asgiref.sync import async_to_sync
from django.contrib.staticfiles import finders
from django.test import Client
from plotly.offline import get_plotlyjs_version

from tests.conftest import ROOT
from tests.webapp.factories import LayerProfileFactory, PlanFactory, RunFactory
from tests.webapp.test_edges_asgi import http_get

pytestmark = pytest.mark.django_db

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
URL = re.compile(r"https?://[^\s\"'<>)]+", re.I)
# identifiers that look like URLs but are never fetched
NAMESPACES = ("http://www.w3.org/2000/svg",)


def served_files() -> list[Path]:
    """Every template and static file of the project (templates/ and static/)."""
    return [p for folder in ("templates", "static")
            for p in sorted((ROOT / folder).rglob("*")) if p.is_file()]


def test_the_project_serves_templates_and_static_files():
    names = {p.name for p in served_files()}
    assert {"base.html", "run.html", "run.js", "live.js", "dashboard.css", "study.html",
            "split.js"} <= names
    # the apps keep none of their own: all of them are under templates/ and static/
    in_apps = [p for folder in ("templates", "static")
               for p in (ROOT / "webapp").glob(f"*/{folder}/**/*") if p.is_file()]
    assert in_apps == []


@pytest.mark.parametrize("path", served_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_template_or_static_file_names_an_outside_url(path: Path):
    urls = [u for u in URL.findall(path.read_text(errors="replace")) if u not in NAMESPACES]
    assert urls == []


def test_plotly_js_is_the_plotly_package_s_own_bundle_and_not_in_the_tree():
    assert PLOTLY_JS.is_file()
    assert Path(finders.find("vendor/plotly.min.js")) == PLOTLY_JS
    answer = async_to_sync(http_get)("/static/vendor/plotly.min.js")  # as the server sends it
    assert answer["status"] == 200
    served = answer["body"]
    assert hashlib.sha256(served).hexdigest() == hashlib.sha256(PLOTLY_JS.read_bytes()).hexdigest()
    assert served.startswith(f"/**\n* plotly.js v{get_plotlyjs_version()}\n".encode())
    copies = [p for p in ROOT.rglob("*.js") if ".venv" not in p.parts and "var" not in p.parts
              and b"plotly.js v" in p.read_bytes()[:200]]
    assert copies == []


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
