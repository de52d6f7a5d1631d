"""Serializer fields for a JSON API: a number must be a JSON number, text a JSON string and a
flag a JSON boolean (DRF alone would take ``"12"`` for 12, ``true`` for 1.0, ``12`` for
``"12"`` and ``"yes"`` or ``1`` for true)."""

from __future__ import annotations

from typing import Any, ClassVar

from rest_framework import serializers


class IntegerField(serializers.IntegerField):
    default_error_messages: ClassVar[dict[str, str]] = {"invalid": "must be an integer"}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, float) and data.is_integer():
            data = int(data)
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class FloatField(serializers.FloatField):
    default_error_messages: ClassVar[dict[str, str]] = {"invalid": "must be a finite number"}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return super().to_internal_value(data)


class BooleanField(serializers.BooleanField):
    default_error_messages: ClassVar[dict[str, str]] = {"invalid": "must be true or false"}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class CharField(serializers.CharField):
    default_error_messages: ClassVar[dict[str, str]] = {"invalid": "must be a string"}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class ObjectField(serializers.JSONField):
    """A JSON object (not an array, string or number)."""

    default_error_messages: ClassVar[dict[str, str]] = {"invalid": "must be a JSON object"}

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail("invalid")
        return super().to_internal_value(data)
