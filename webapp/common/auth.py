"""Browser users: Django sessions, answering 401 (not 403) when nobody is logged in."""

from __future__ import annotations

from rest_framework import authentication
from rest_framework.request import Request


class SessionAuthentication(authentication.SessionAuthentication):
    def authenticate_header(self, request: Request) -> str:
        return 'Session realm="edgepipe", login="/api-auth/login/"'
