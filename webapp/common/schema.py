"""How the OpenAPI schema describes the two ways in (a browser session and a device key) and
the errors every endpoint shares: one body per status, as webapp.common.errors writes it.

An endpoint lists the errors it gives with ``errors(...)`` beside its successes::

    @extend_schema(responses={200: RunOutput, **errors(401, 404, 409, conflict="...")})

Each status has the body of webapp.common.errors and a default description; a keyword
(``invalid``, ``unauthenticated``, ``forbidden``, ``not_found``, ``conflict``) gives the
endpoint's own reason instead."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class SessionScheme(OpenApiAuthenticationExtension):
    target_class = "webapp.common.auth.SessionAuthentication"
    name = "session"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "cookie", "name": settings.SESSION_COOKIE_NAME,
                "description": "a Django session: log in at /api-auth/login/"}


class DeviceKeyScheme(OpenApiAuthenticationExtension):
    target_class = "webapp.devices.auth.DeviceKeyAuthentication"
    name = "deviceKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Device <device uid>:<device key>`, as returned by enrolment"}


# --------------------------------------------------------------------------- error bodies


class ErrorOutput(serializers.Serializer):
    detail = serializers.CharField(help_text="what went wrong, fit to show to the user")


class FieldErrorOutput(serializers.Serializer):
    field = serializers.CharField(
        help_text="the bad field as a path (`devices[1]`, `profile.layers[3].forward_s`); "
                  "`body` when the request as a whole is wrong")
    reason = serializers.CharField()


class InvalidOutput(serializers.Serializer):
    detail = serializers.CharField(help_text="`<first field>: <reason>`")
    errors = FieldErrorOutput(many=True, help_text="every bad field")


class ConflictOutput(serializers.Serializer):
    detail = serializers.CharField()
    state = serializers.CharField(help_text="the object's current state")
    action = serializers.CharField(help_text="the action refused")
    transition = serializers.CharField(
        required=False, help_text="`<state> -> <target>`, for a state machine's transitions")


CSRF = "the CSRF check failed (a session's writes send its X-CSRFToken header)"
STAFF = f"only staff users may do this (the detail says so), or {CSRF}"

_ERRORS: dict[int, tuple[str, type[serializers.Serializer], str]] = {
    400: ("invalid", InvalidOutput,
          "Invalid input: `errors` names each bad field and why, `detail` the first."),
    401: ("unauthenticated", ErrorOutput,
          "Not authenticated: no session (log in at /api-auth/login/) on a user's endpoint, "
          "no device key or a wrong one on an agent's."),
    403: ("forbidden", ErrorOutput, f"Refused: {CSRF}."),
    404: ("not_found", ErrorOutput, "Not found: the detail names what does not exist."),
    409: ("conflict", ConflictOutput,
          "The object's current state does not allow this: `state` and `action` say which."),
}


def errors(*statuses: int, **why: str) -> dict[int, OpenApiResponse]:
    """The error answers ``statuses`` (400, 401, 403, 404, 409) as ``extend_schema`` takes
    them, each with its body; ``why`` replaces a default description, by status name."""
    names = {name: status for status, (name, _, _) in _ERRORS.items()}
    unknown = set(why) - {n for n, s in names.items() if s in statuses}
    if unknown:
        raise ValueError(f"errors(): {', '.join(sorted(unknown))} names no status given "
                         f"({', '.join(map(str, statuses))})")
    answers = {}
    for status in statuses:
        if status not in _ERRORS:
            raise ValueError(f"errors(): no error body for status {status}")
        name, body, default = _ERRORS[status]
        answers[status] = OpenApiResponse(body, description=why.get(name, default))
    return answers


def json_errors(*statuses: int, **why: str) -> dict[tuple[int, str], OpenApiResponse]:
    """``errors`` for an endpoint that also renders other media types (raw bytes): its errors
    are JSON whatever the client accepts."""
    return {(status, "application/json"): answer
            for status, answer in errors(*statuses, **why).items()}
