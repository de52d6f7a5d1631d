"""Failed logins, counted per username and per client address in Django's cache, which every
web process shares (Redis; in the embedded setup, files under var/): after
``LOGIN_FAILURES_LIMIT`` failures for one username, or from one address, within
``LOGIN_FAILURES_WINDOW_S`` seconds, further attempts are refused until the oldest of those
failures is that old. A successful login forgets its username's failures (not its address's:
one account of one's own must not buy more guesses at the others).

Counting is atomic, so that attempts arriving at the same moment, in one process or in
several, cannot get more than the limit of passwords tried. Each username and each address
has LIMIT slots: cache keys that live WINDOW seconds, each holding the time of the attempt
that took it. An attempt takes one slot of its username and one of its address with
``cache.add`` (Redis's SET NX; the in-memory cache's lock) *before* its password is tried
(:class:`~webapp.accounts.backends.LoginThrottleBackend`), and is refused when every slot is
taken: a sliding window of at most LIMIT tries. A failed attempt keeps its slots; a successful
login gives them back (``user_logged_in``: an ``authenticate()`` that no ``login()`` follows
counts as a failure). The file cache's ``add`` is a read then a write, atomic only as far as
this module's lock makes it so: among the threads of its one web process."""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

# takes a slot in one step whatever the cache backend, among the threads of this process
_taking = threading.Lock()


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


def _slots(key: str) -> list[str]:
    return [f"{key}:{i}" for i in range(settings.LOGIN_FAILURES_LIMIT)]


def _wait_s(key: str, at: float) -> float:
    """Seconds until a slot of ``key`` frees (0: one is free now)."""
    held = cache.get_many(_slots(key))
    if len(held) < settings.LOGIN_FAILURES_LIMIT:
        return 0.0
    oldest = min((t for t in held.values() if isinstance(t, float)), default=at)
    # at least a second: a slot the cache still holds is taken, whatever another clock says
    return max(1.0, oldest + settings.LOGIN_FAILURES_WINDOW_S - at)


def retry_after(*, username: str | None, address: str | None) -> int:
    """Seconds until a login as ``username`` from ``address`` may be tried again (0: now)."""
    at = now()
    return math.ceil(max((_wait_s(key, at) for key in _keys(username, address)), default=0.0))


def _slot_take(key: str, at: float) -> str | None:
    """A free slot of ``key``, taken (None when all are)."""
    slots = _slots(key)
    held = cache.get_many(slots)
    for slot in slots:
        # add is atomic: of attempts racing for one slot, one gets it and the others go on
        if slot not in held and cache.add(slot, at, timeout=settings.LOGIN_FAILURES_WINDOW_S):
            return slot
    return None


@dataclass(frozen=True)
class Attempt:
    """A login attempt: let through holding ``slots``, or refused for ``retry_after`` s."""

    slots: tuple[str, ...] = ()
    retry_after: int = 0


def attempt_start(*, username: str | None, address: str | None) -> Attempt:
    """Count an attempt at ``username``'s password from ``address`` before it is tried: a slot
    of each taken, or a refusal (nothing taken) when one of them has none left."""
    at = now()
    taken: list[str] = []
    with _taking:
        for key in _keys(username, address):
            slot = _slot_take(key, at)
            if slot is None:
                cache.delete_many(taken)  # not tried: it does not count for the other key
                # a second at least: a slot that freed since is the next attempt's
                return Attempt(retry_after=max(1, math.ceil(_wait_s(key, at))))
            taken.append(slot)
    return Attempt(slots=tuple(taken))


def attempt_succeeded(*, username: str, slots: Iterable[str] = ()) -> None:
    """``username`` logged in: the attempt's ``slots`` are given back, and its username's
    earlier failures no longer count."""
    cache.delete_many([*slots, *_slots(_key("user", username.casefold()))])


def on_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """``user_logged_in``."""
    attempt_succeeded(username=user.get_username(),
                      slots=getattr(request, "login_slots", ()) if request is not None else ())
