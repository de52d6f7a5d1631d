"""The first of AUTHENTICATION_BACKENDS: whatever asks Django to check a password (the login
forms, the admin's, any ``authenticate()``), the attempt is counted before the password is
tried (webapp.accounts.throttle), and refused when its username or its address has had too
many recent failures."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from webapp.accounts.throttle import attempt_start, client_address


class LoginThrottleBackend:
    """Refuses, or counts the attempt and lets the next backend (ModelBackend) check the
    password. It has no ``get_user``: sessions name the backend that checked the password,
    never this one."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     **credentials: Any) -> None:
        attempt = attempt_start(username=username, address=client_address(request))
        if attempt.retry_after:
            if request is not None:  # for the login form's answer (429, Retry-After)
                request.login_retry_after = attempt.retry_after  # type: ignore[attr-defined]
            # PermissionDenied: authenticate() asks no other backend
            raise PermissionDenied("too many failed logins")
        if request is not None:  # given back if the password is right (throttle.on_logged_in)
            request.login_slots = [  # type: ignore[attr-defined]
                *getattr(request, "login_slots", ()), *attempt.slots]
        return None
