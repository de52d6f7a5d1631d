"""Password guessing is throttled: after LOGIN_FAILURES_LIMIT failed logins for one username,
or from one address, within LOGIN_FAILURES_WINDOW_S, further attempts (even with the right
password) are refused until the window has passed: the login forms say so, with 429 and
Retry-After; a successful login resets its username's count. The counts live in Django's
cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import authenticate
from django.core.cache import cache
from django.test import Client, RequestFactory, override_settings

from tests.webapp.factories import UserFactory
from webapp.accounts import throttle

pytestmark = pytest.mark.django_db

PASSWORD = "pass-word-1"  # UserFactory's
REFUSED = "Too many failed logins for this username or from this address"


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    cache.clear()
    clock = Clock()
    monkeypatch.setattr(throttle, "now", clock)
    yield clock
    cache.clear()


def post(path: str, username: str, password: str, address: str = "10.0.0.1") -> Any:
    return Client().post(path, {"username": username, "password": password},
                         REMOTE_ADDR=address)


def logged_in(answer: Any) -> bool:
    return answer.status_code == 302 and "_auth_user_id" in answer.wsgi_request.session


@pytest.mark.parametrize("path", ["/login/", "/api-auth/login/"])
def test_ten_failures_for_a_username_refuse_its_logins_until_the_window_passes(
        path: str, clock: Clock) -> None:
    user = UserFactory()
    for k in range(10):  # from ten addresses: the username's count
        answer = post(path, user.username, "wrong", address=f"10.0.1.{k}")
        assert answer.status_code == 200 and REFUSED not in answer.content.decode()
        clock.t += 60
    answer = post(path, user.username, PASSWORD, address="10.0.2.1")
    assert answer.status_code == 429
    # ten failures a minute apart: the first one is five minutes from leaving the window
    page = answer.content.decode()
    assert REFUSED in page and "try again in 5 minutes" in page
    assert answer["Retry-After"] == str(5 * 60)
    assert not logged_in(answer)
    # the username regardless of case; others are not concerned
    assert post(path, user.username.upper(), PASSWORD, address="10.0.2.2").status_code == 429
    assert logged_in(post(path, UserFactory().username, PASSWORD, address="10.0.2.3"))
    # the first failure leaves the window: one more attempt, and the right password
    clock.t += 5 * 60
    assert logged_in(post(path, user.username, PASSWORD, address="10.0.2.1"))


def test_ten_failures_from_an_address_refuse_its_logins(clock: Clock) -> None:
    user = UserFactory()
    for k in range(10):  # ten usernames, one address
        assert post("/login/", f"guess{k}", "wrong", address="192.0.2.7").status_code == 200
    answer = post("/login/", user.username, PASSWORD, address="192.0.2.7")
    assert answer.status_code == 429 and REFUSED in answer.content.decode()
    assert logged_in(post("/login/", user.username, PASSWORD, address="192.0.2.8"))
    # a success from elsewhere does not reset the address's count
    assert post("/login/", user.username, PASSWORD, address="192.0.2.7").status_code == 429
    clock.t += 15 * 60 + 1
    assert logged_in(post("/login/", user.username, PASSWORD, address="192.0.2.7"))


def test_a_successful_login_resets_the_usernames_count(clock: Clock) -> None:
    user = UserFactory()
    for k in range(9):
        post("/login/", user.username, "wrong", address=f"10.0.3.{k}")
    assert logged_in(post("/login/", user.username, PASSWORD, address="10.0.4.1"))
    for k in range(9):  # nine more: ten would refuse had the first nine still counted
        answer = post("/login/", user.username, "wrong", address=f"10.0.5.{k}")
        assert answer.status_code == 200 and REFUSED not in answer.content.decode()
    assert logged_in(post("/login/", user.username, PASSWORD, address="10.0.4.2"))


def test_every_path_to_a_password_is_throttled() -> None:
    """The admin's login form says so too, and authenticate() itself refuses (whatever calls
    it): the first authentication backend refuses before the password is tried."""
    staff = UserFactory(is_staff=True, is_superuser=True)
    request = RequestFactory().post("/anywhere/", REMOTE_ADDR="10.9.9.9")
    for _ in range(10):
        assert authenticate(request, username=staff.username, password="wrong") is None
    assert authenticate(request, username=staff.username, password=PASSWORD) is None
    assert authenticate(None, username=staff.username, password=PASSWORD) is None
    answer = Client().post("/admin/login/", {"username": staff.username, "password": PASSWORD},
                           REMOTE_ADDR="10.9.9.10")
    assert answer.status_code == 200 and REFUSED in answer.content.decode()
    assert "_auth_user_id" not in answer.wsgi_request.session


def test_the_counts_live_in_the_shared_cache_not_in_the_process(tmp_path: Path) -> None:
    files = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                         "LOCATION": str(tmp_path / "cache")}}
    user = UserFactory()
    with override_settings(CACHES=files):
        for _ in range(10):
            post("/login/", user.username, "wrong")
        assert any((tmp_path / "cache").iterdir())
    # another process (this one, with its in-memory cache) has not seen them
    assert logged_in(post("/login/", user.username, PASSWORD, address="10.0.0.2"))
    with override_settings(CACHES=files):  # a process on the same cache has
        assert post("/login/", user.username, PASSWORD, address="10.0.0.2").status_code == 429
