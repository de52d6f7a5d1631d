"""Helpers the API views share."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, QuerySet
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request

M = TypeVar("M", bound=Model)


def get_or_404(queryset: QuerySet[M], pk: Any, *, what: str) -> M:
    found = queryset.filter(pk=pk).first()
    if found is None:
        raise NotFound(f"{what} {pk} does not exist")
    return found


def validated(serializer_class: type[serializers.Serializer], request: Request,
              **kwargs: Any) -> dict[str, Any]:
    """The request body validated by ``serializer_class`` (a 400 naming each bad field)."""
    data = request.data
    if not isinstance(data, dict):
        raise serializers.ValidationError({"body": ["must be a JSON object"]})
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
