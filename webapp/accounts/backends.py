"""The first of AUTHENTICATION_BACKENDS: whatever asks Django to check a password (the login
forms, the admin's, any ``authenticate()``), a username or an address with too many recent
failures is refused before the password is tried."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from webapp.accounts.throttle import client_address, retry_after


class LoginThrottleBackend:
    """Refuses, or lets the next backend (ModelBackend) check the password. It has no
    ``get_user``: sessions name the backend that checked the password, never this one."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     **credentials: Any) -> None:
        if retry_after(username=username, address=client_address(request)):
            if request is not None:
                # not counted again as a failure: it was not a guess (throttle.on_login_failed)
                request.login_refused = True  # type: ignore[attr-defined]
            # PermissionDenied: authenticate() asks no other backend
            raise PermissionDenied("too many failed logins")
        return None
