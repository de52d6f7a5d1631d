"""Failed logins, counted per username and per client address in Django's cache, which every
web process shares (Redis; in the embedded setup, files under var/): after
``LOGIN_FAILURES_LIMIT`` failures for one username, or from one address, within
``LOGIN_FAILURES_WINDOW_S`` seconds, further attempts are refused until the oldest of those
failures is that old. A successful login forgets its username's failures (not its address's:
one account of one's own must not buy more guesses at the others).

Each key holds the times of its latest failures (at most the limit): a sliding window, the same
with every cache backend. Counting is a read then a write, so attempts that run at the same
moment in different processes may each count once less; one process runs its logins one after
the other (Django runs synchronous views on one thread under ASGI)."""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.http import HttpRequest


def now() -> float:
    """The clock the window is measured on (the tests move it)."""
    return time.time()


def client_address(request: HttpRequest | None) -> str | None:
    """The address a login came from: the connection's peer (behind a reverse proxy, run
    daphne with --proxy-headers so that it is the client's, not the proxy's)."""
    if request is None:
        return None
    return request.META.get("REMOTE_ADDR") or None


def _key(kind: str, value: str) -> str:
    # hashed: any username is a valid cache key (memcached refuses spaces and long keys)
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return f"login-failures:{kind}:{digest}"


def _keys(username: str | None, address: str | None) -> list[str]:
    keys = []
    if username:
        keys.append(_key("user", username.casefold()))
    if address:
        keys.append(_key("address", address))
    return keys


def _recent(times: Any, since: float) -> list[float]:
    if not isinstance(times, list):
        return []
    return [t for t in times if isinstance(t, float) and t > since]


def retry_after(*, username: str | None, address: str | None) -> int:
    """Seconds until a login as ``username`` from ``address`` may be tried again (0: now)."""
    limit, window = settings.LOGIN_FAILURES_LIMIT, settings.LOGIN_FAILURES_WINDOW_S
    at = now()
    wait = 0.0
    for times in cache.get_many(_keys(username, address)).values():
        recent = _recent(times, at - window)
        if len(recent) >= limit:
            wait = max(wait, recent[-limit] + window - at)
    return math.ceil(wait)


def failure_record(*, username: str | None, address: str | None) -> None:
    """One more failed login as ``username`` from ``address``."""
    limit, window = settings.LOGIN_FAILURES_LIMIT, settings.LOGIN_FAILURES_WINDOW_S
    at = now()
    keys = _keys(username, address)
    found = cache.get_many(keys)
    cache.set_many({key: [*_recent(found.get(key), at - window), at][-limit:] for key in keys},
                   timeout=window)


def failures_forget(*, username: str) -> None:
    """``username`` logged in: its failures no longer count."""
    cache.delete(_key("user", username.casefold()))


def on_login_failed(sender: Any, credentials: dict[str, Any],
                    request: HttpRequest | None = None, **kwargs: Any) -> None:
    """``user_login_failed``: counted, unless the attempt was refused for the failures before
    it (the password was not tried)."""
    if request is not None and getattr(request, "login_refused", False):
        return
    username = credentials.get(get_user_model().USERNAME_FIELD)
    failure_record(username=username if isinstance(username, str) else None,
                   address=client_address(request))


def on_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """``user_logged_in``."""
    failures_forget(username=user.get_username())
