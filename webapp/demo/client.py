"""The demo's REST client: logs in like a browser (Django session + CSRF) and turns every
answer that is not a success into a DemoError that names the request and the server's reason."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx


class DemoError(RuntimeError):
    """The demo cannot go on; the message says where and why. An API's 400 answer keeps its
    field errors (``errors``: {field, reason} each) for the demo to name its own option."""

    def __init__(self, message: str, *, status: int | None = None,
                 errors: Sequence[dict[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.errors = tuple(errors)


class ApiClient:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=30, follow_redirects=False)

    def wait_until_up(self, *, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.http.get("/api-auth/login/").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise DemoError(f"the web server did not answer on {self.base_url} within "
                        f"{timeout_s:.0f} s")

    def login(self, username: str, password: str) -> None:
        self.http.get("/api-auth/login/")
        csrf = self.http.cookies.get("csrftoken", "")
        answer = self.http.post("/api-auth/login/", data={
            "username": username, "password": password, "csrfmiddlewaretoken": csrf,
            "next": "/api/"}, headers={"Referer": f"{self.base_url}/api-auth/login/"})
        if answer.status_code != 302 or "sessionid" not in self.http.cookies:
            raise DemoError(f"logging in as {username} failed ({answer.status_code})")

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"X-CSRFToken": self.http.cookies.get("csrftoken", ""),
                   "Referer": f"{self.base_url}/"}
        answer = self.http.request(method, path, json=body, headers=headers)
        if answer.status_code >= 400:
            errors: list[dict[str, str]] = []
            try:
                said = answer.json()
                detail = said.get("detail", answer.text)
                errors = [e for e in said.get("errors") or () if isinstance(e, dict)]
            except (ValueError, AttributeError):
                detail = answer.text[:300]
            raise DemoError(f"{method} {path} answered {answer.status_code}: {detail}",
                            status=answer.status_code, errors=errors)
        return answer.json() if answer.content else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", path, body or {})


FIRST_LOOK_S = 0.05  # wait_for looks again this soon at first,
LOOK_GROWTH = 1.5  # then this many times later each time, up to its every_s


def wait_for(condition: Callable[[], Any], *, timeout_s: float, what: str,
             every_s: float = 0.25) -> Any:
    """Poll ``condition`` until it returns something truthy; DemoError after ``timeout_s``.
    The looks come quickly at first and then further apart, up to ``every_s``: each step of
    the demo's start-up waits for something that takes from a tenth of a second to a few,
    and finds it done half a look late on average (each look is one request to the web
    server, which shares the processors with the agents)."""
    deadline = time.monotonic() + timeout_s
    pause_s = min(FIRST_LOOK_S, every_s)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(pause_s)
        pause_s = min(every_s, pause_s * LOOK_GROWTH)


def option_error(exc: DemoError, options: dict[str, str]) -> DemoError:
    """The API's 400 answer as the demo option it is about (``options``: the option of each
    API field), as "--sigma2: must be at most 2 ..."; any other error as it is."""
    if exc.status != 400 or not exc.errors:
        return exc
    field, reason = exc.errors[0].get("field", ""), exc.errors[0].get("reason", "")
    option = options.get(field.split(".")[-1].split("[")[0])
    return DemoError(f"{option}: {reason}" if option else f"{field}: {reason}")
