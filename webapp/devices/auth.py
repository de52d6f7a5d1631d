"""Agents authenticate with ``Authorization: Device <uid>:<key>``: the uid and key they got at
enrolment. The key is checked against its salted hash in constant time; a retired device's key
no longer works. The authenticated device is ``request.auth``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from webapp.devices.models import Device
from webapp.devices.selectors import device_by_credentials

KEYWORD = "Device"


class DeviceKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[AnonymousUser, Device] | None:
        header = authentication.get_authorization_header(request)
        if not header:
            return None
        try:
            scheme, _, credentials = header.decode("ascii").partition(" ")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Authorization header is not ASCII") from None
        if scheme.lower() != KEYWORD.lower():
            return None
        uid, sep, key = credentials.strip().partition(":")
        if not sep or not uid or not key:
            raise exceptions.AuthenticationFailed(
                f"Authorization must be '{KEYWORD} <device uid>:<device key>'")
        device = device_by_credentials(uid=uid, key=key)
        if device is None:
            raise exceptions.AuthenticationFailed("unknown device or wrong device key")
        return AnonymousUser(), device

    def authenticate_header(self, request: Request) -> str:
        return f'{KEYWORD} realm="edgepipe"'


class IsDevice(permissions.BasePermission):
    message = "this endpoint is for enrolled devices"

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Device)
