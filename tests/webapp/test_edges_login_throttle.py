"""Password guessing is throttled: after LOGIN_FAILURES_LIMIT failed logins for one username,
or from one address, within LOGIN_FAILURES_WINDOW_S, further attempts (even with the right
password) are refused until the window has passed: the login forms say so, with 429 and
Retry-After; a successful login resets its username's count. The counts live in Django's
cache, and attempts made at the same moment, by threads or by processes, never get more than
the limit of passwords tried."""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.locmem import LocMemCache
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


CLOCK = Clock()


class ClockedCache(LocMemCache):
    """The in-memory cache on the tests' clock: its entries expire as CLOCK moves."""

    def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> float | None:
        if timeout == DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        return None if timeout is None else CLOCK.t + (timeout or -1)

    def _has_expired(self, key: str) -> bool:
        expiry = self._expire_info.get(key, -1)
        return expiry is not None and expiry <= CLOCK.t


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    CLOCK.t = 1_000_000.0
    monkeypatch.setattr(throttle, "now", CLOCK)
    with override_settings(CACHES={"default": {"BACKEND": f"{__name__}.ClockedCache"}}):
        cache.clear()
        yield CLOCK
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


ATTEMPTS = 30


@pytest.fixture
def tried(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The usernames whose password was checked, each check taking as long as hashing a real
    password does (tens of milliseconds): the attempts that arrive meanwhile find nothing
    counted yet unless counting comes first."""
    checked: list[str] = []

    def check(backend: ModelBackend, request: Any, username: str | None = None,
              password: str | None = None, **kwargs: Any) -> None:
        checked.append(str(username))
        time.sleep(0.05)
        return None

    monkeypatch.setattr(ModelBackend, "authenticate", check)
    return checked


@pytest.mark.parametrize("same", ["username", "address"])
def test_guesses_at_the_same_moment_get_no_more_tries_than_the_limit(
        same: str, tried: list[str], settings: Any) -> None:
    # Prepare: ATTEMPTS threads guess at once, at one username from many addresses or at
    # many usernames from one address
    start = threading.Barrier(ATTEMPTS)

    def guess(k: int) -> int:
        username, address = (("victim", f"10.7.0.{k}") if same == "username" else
                             (f"guess{k}", "192.0.2.9"))
        start.wait()
        return int(post("/login/", username, f"wrong-{k}", address=address).status_code)

    # Execute
    with ThreadPoolExecutor(ATTEMPTS) as pool:
        statuses = list(pool.map(guess, range(ATTEMPTS)))
    # Assert: exactly the limit tried; the others refused before their password was
    limit = settings.LOGIN_FAILURES_LIMIT
    assert len(tried) == limit
    assert sorted(statuses) == [200] * limit + [429] * (ATTEMPTS - limit)


def test_an_attempt_refused_for_its_address_does_not_count_for_its_username() -> None:
    for k in range(10):
        assert not throttle.attempt_start(username=f"u{k}", address="198.51.100.1").retry_after
    refused = throttle.attempt_start(username="victim", address="198.51.100.1")
    assert refused.retry_after == 15 * 60 and refused.slots == ()
    for k in range(10):
        attempt = throttle.attempt_start(username="victim", address=f"198.51.100.{k + 2}")
        assert not attempt.retry_after and len(attempt.slots) == 2
    assert throttle.retry_after(username="victim", address=None) == 15 * 60


@pytest.mark.integration
def test_processes_guessing_at_once_on_redis_get_no_more_tries_than_the_limit() -> None:
    """Web processes share Redis: its SET NX (cache.add) is what keeps the count there."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 6379)) != 0:
            pytest.fail("Redis on 127.0.0.1:6379 not reachable: the integration tests need it "
                        "(.ci/run installs and starts it)", pytrace=False)
    redis = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                         "LOCATION": "redis://127.0.0.1:6379/0",
                         "KEY_PREFIX": f"edgepipe-throttle-test-{uuid.uuid4().hex[:8]}"}}
    processes = multiprocessing.get_context("fork")
    start, results = processes.Barrier(ATTEMPTS), processes.Queue()

    def guess(k: int) -> None:  # in a process of its own
        start.wait()
        attempt = throttle.attempt_start(username="victim", address=f"10.9.0.{k}")
        results.put(not attempt.retry_after)

    with override_settings(CACHES=redis):
        try:
            guessers = [processes.Process(target=guess, args=(k,)) for k in range(ATTEMPTS)]
            for p in guessers:
                p.start()
            admitted = [results.get(timeout=30) for _ in guessers]
            for p in guessers:
                p.join(timeout=30)
            assert sum(admitted) == 10
        finally:
            keys = [throttle._key("user", "victim"),
                    *(throttle._key("address", f"10.9.0.{k}") for k in range(ATTEMPTS))]
            cache.delete_many([slot for key in keys for slot in throttle._slots(key)])
