"""Who may change what. Any logged-in user reads; staff users (``is_staff``) alone manage
enrolment tokens, retire devices and drive their agents (stop one, change its emulation).

``IsStaff`` is DRF's IsAdminUser whose 403 says what only staff may do (the view's
``staff_action``); ``IsStaffOrReadOnly`` leaves the safe methods (GET, HEAD, OPTIONS) to any
user the other permissions let in. Put them after IsAuthenticated, so that a request without a
session stays a 401. ``staff_required`` is the same rule for the dashboard's Django views: a
logged-in user who is not staff gets a 403 page, for every method or only for the methods
named (a page anyone may read whose form only staff may send)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import wraps
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from rest_framework.permissions import SAFE_METHODS, IsAdminUser, IsAuthenticated
from rest_framework.request import Request


def staff_only_message(action: str) -> str:
    return (f"only staff users may {action}; ask an administrator (a user with is_staff) to "
            "do it or to make you staff")


class IsStaff(IsAdminUser):
    """DRF's IsAdminUser (``request.user.is_staff``), answering a 403 that names what the view
    does (its ``staff_action``, "retire devices")."""

    def has_permission(self, request: Request, view: Any) -> bool:
        allowed = super().has_permission(request, view)
        if not allowed:  # a new instance per request: the message is this request's
            self.message = staff_only_message(getattr(view, "staff_action", "do this"))
        return allowed


class IsStaffOrReadOnly(IsStaff):
    """Reads for anyone, writes for staff."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return request.method in SAFE_METHODS or super().has_permission(request, view)


# the permission_classes of a view: a session first (401 without one), then staff (403)
STAFF = (IsAuthenticated, IsStaff)
STAFF_WRITES = (IsAuthenticated, IsStaffOrReadOnly)

View = Callable[..., HttpResponse]


def staff_required(*, action: str, methods: Collection[str] | None = None
                   ) -> Callable[[View], View]:
    """A dashboard view only staff users may call (with ``methods``: only those methods), for
    use under ``login_required``: others get PermissionDenied, a 403 saying ``action``."""
    only = None if methods is None else {m.upper() for m in methods}

    def decorate(view: View) -> View:
        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if (only is None or request.method in only) and not request.user.is_staff:
                raise PermissionDenied(staff_only_message(action))
            return view(request, *args, **kwargs)

        return guarded

    return decorate
