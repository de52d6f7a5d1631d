"""The ASGI application's edges: a WebSocket to a path no consumer serves is refused before
its handshake (Channels' router raised "No route found": a 500 and a traceback), and a static
file path that climbs out of the static directories is a 404 (Django's static handler let a
SuspiciousFileOperation through: a 500 and a traceback)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote

import pytest
from asgiref.sync import async_to_sync
from channels.testing import ApplicationCommunicator, WebsocketCommunicator
from django.test import Client

from webapp.asgi import application

TRAVERSALS = [
    "/static/..%2f..%2fmanage.py",
    "/static/../../manage.py",
    "/static/%2e%2e/%2e%2e/%2e%2e/manage.py",
    "/static/dashboard/..%2f..%2f..%2f..%2fsettings%2fbase.py",
    "/static/..%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
    "/static/vendor/..%2f..%2f..%2fmanage.py",
    "/static/vendor/..%2fvendor%2f..%2f..%2fplotly%2f__init__.py",
]


async def http_get(path: str) -> dict[str, Any]:
    """The ASGI application's answer to GET ``path`` (as daphne gives it: ``path`` decoded)."""
    scope = {"type": "http", "http_version": "1.1", "method": "GET", "path": unquote(path),
             "raw_path": path.encode(), "query_string": b"", "headers": [],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
    app = ApplicationCommunicator(application, scope)
    await app.send_input({"type": "http.request", "body": b""})
    start = await app.receive_output(timeout=10)
    body = b""
    while True:  # a file's last chunk may carry no "body"
        chunk = await app.receive_output(timeout=10)
        body += chunk.get("body", b"")
        if not chunk.get("more_body", False):
            break
    await app.wait(timeout=10)
    return {"status": start["status"], "body": body}


@pytest.mark.django_db  # Channels closes old database connections as a consumer stops
@pytest.mark.parametrize("path", ["/ws/nope/", "/", "/ws/agent", "/ws/runs/abc/",
                                  "/ws/agent/extra/", "/static/x.js"])
def test_a_websocket_to_an_unknown_path_is_refused_before_the_handshake(
        path: str, caplog: pytest.LogCaptureFixture) -> None:
    async def connect() -> tuple[bool, Any]:
        link = WebsocketCommunicator(application, path)
        answer = await link.connect(timeout=5)
        await link.disconnect(timeout=5)  # as daphne does after refusing the handshake
        return answer

    with caplog.at_level(logging.WARNING):
        connected, _ = async_to_sync(connect)()
    assert connected is False
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.django_db
@pytest.mark.parametrize("path", TRAVERSALS)
def test_a_static_path_out_of_the_static_directories_is_404(
        path: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        answer = async_to_sync(http_get)(path)
        assert Client(raise_request_exception=True).get(path).status_code == 404
    assert answer["status"] == 404
    assert b"Traceback" not in answer["body"] and b"manage.py" not in answer["body"]
    assert b"DJANGO_SETTINGS_MODULE" not in answer["body"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.django_db
def test_static_files_are_still_served() -> None:
    answer = async_to_sync(http_get)("/static/rest_framework/css/bootstrap.min.css")
    assert answer["status"] == 200 and b"Bootstrap" in answer["body"]
    assert async_to_sync(http_get)("/static/no/such/file.css")["status"] == 404
