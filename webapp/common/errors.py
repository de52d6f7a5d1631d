"""One JSON shape for every API error.

- 400: ``{"detail": "<first field>: <reason>", "errors": [{"field": ..., "reason": ...}]}``
  with fields as paths (``profile.layers[3].forward_s``, ``devices[1]``); ``body`` when the
  request as a whole is wrong (not JSON, not an object);
- 401 / 403 / 404 / 405: ``{"detail": ...}``;
- 409: ``{"detail": ..., "state": <current state>, "action": <refused action>,
  "transition": "<state> -> <target>"}`` (the last for state-machine transitions).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from webapp.common.exceptions import ApplicationError, Conflict, IllegalTransition, InvalidInput

BODY = "body"


def _join(prefix: str, key: Any) -> str:
    if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
        return f"{prefix}[{key}]"
    if key == api_settings.NON_FIELD_ERRORS_KEY:
        return prefix
    return f"{prefix}.{key}" if prefix else str(key)


def flatten_errors(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    """DRF's nested error detail as a flat list of {field, reason}."""
    if isinstance(detail, dict):
        return [e for key, value in detail.items()
                for e in flatten_errors(value, _join(prefix, key))]
    if isinstance(detail, list):
        if all(isinstance(item, str) for item in detail):
            return [{"field": prefix or BODY, "reason": str(item)} for item in detail]
        return [e for i, item in enumerate(detail) if item
                for e in flatten_errors(item, _join(prefix, i))]
    return [{"field": prefix or BODY, "reason": str(detail)}]


def invalid_response(errors: list[dict[str, str]]) -> Response:
    first = errors[0] if errors else {"field": BODY, "reason": "is invalid"}
    return Response({"detail": f"{first['field']}: {first['reason']}", "errors": errors},
                    status=status.HTTP_400_BAD_REQUEST)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, InvalidInput):
        return invalid_response([e.to_json() for e in exc.errors])
    if isinstance(exc, Conflict):
        body: dict[str, Any] = {"detail": exc.message, "state": exc.state, "action": exc.action}
        if isinstance(exc, IllegalTransition):
            body["transition"] = exc.transition
        return Response(body, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, ApplicationError):
        return Response({"detail": exc.message}, status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {BODY: exc.messages}
        return invalid_response(flatten_errors(detail))
    if isinstance(exc, exceptions.ValidationError):
        return invalid_response(flatten_errors(exc.detail))
    if isinstance(exc, exceptions.ParseError):
        return invalid_response([{"field": BODY, "reason": str(exc.detail)}])
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "detail" in response.data:
        response.data = {"detail": str(response.data["detail"])}
    return response
