"""How the OpenAPI schema describes the two ways in: a browser session and a device key."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension


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
