"""A small validator of API answers against the OpenAPI 3.0 schema drf-spectacular generates:
the subset of the schema language it uses ($ref, allOf/oneOf/anyOf, nullable, type, format
date-time, enum, properties, required, additionalProperties, items). The tests use it to check
that what an endpoint really answers, null or error, is what the schema promises."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.test import override_settings
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

JSON = "application/json"

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float),
}


def generate() -> dict[str, Any]:
    """The schema as /api/schema/ serves it, checked against the OpenAPI 3.0 meta-schema."""
    with override_settings(DEBUG=False):
        schema: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)
    validate_schema(schema)
    return schema


class Schema:
    """One generated schema, and its operations found by concrete path."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        self.components = document["components"]["schemas"]
        self._paths = [(re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", p) + "$"), p)
                       for p in document["paths"]]

    def template(self, path: str) -> str:
        """The schema's path for a concrete one (``/api/runs/3/`` -> ``/api/runs/{run_id}/``)."""
        path = path.partition("?")[0]
        found = [template for pattern, template in self._paths if pattern.match(path)]
        if not found:
            raise AssertionError(f"{path} is not in the schema")
        return min(found, key=lambda t: t.count("{"))  # a literal segment beats a parameter

    def operation(self, method: str, path: str) -> dict[str, Any]:
        operations = self.document["paths"][self.template(path)]
        if method.lower() not in operations:
            raise AssertionError(f"{method.upper()} {path} is not in the schema")
        operation: dict[str, Any] = operations[method.lower()]
        return operation

    def problems(self, method: str, path: str, status: int, content_type: str,
                 body: Any) -> list[str]:
        """What is wrong with answering ``status`` and ``body`` to ``method path`` (nothing:
        an empty list): an undocumented status or media type, or a body that does not match."""
        where = f"{method.upper()} {self.template(path)} {status}"
        responses = self.operation(method, path)["responses"]
        response = responses.get(str(status))
        if response is None:
            return [f"{where}: undocumented status (documented: {', '.join(sorted(responses))})"]
        content = response.get("content") or {}
        media = content_type.split(";")[0].strip()
        if not content:
            return [] if body in (None, b"", "") else [f"{where}: a body where none is documented"]
        if media not in content:
            return [f"{where}: undocumented media type {media} (documented: {', '.join(content)})"]
        if media != JSON:
            return []
        return self.mismatches(body, content[media].get("schema", {}), where)

    def mismatches(self, value: Any, schema: Mapping[str, Any], where: str) -> list[str]:
        """How ``value`` differs from ``schema`` (an empty list: it matches)."""
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            return self.mismatches(value, self.components[name], where)
        if value is None:
            if schema.get("nullable") or (None in schema.get("enum", ())):
                return []
            if not schema.get("type") and not _combined(schema):
                return []  # any value (a JSON field)
            return [f"{where}: null, but the schema does not say nullable"]
        problems = [p for sub in schema.get("allOf", ())
                    for p in self.mismatches(value, sub, where)]
        for keyword in ("oneOf", "anyOf"):
            if keyword in schema:
                options = [self.mismatches(value, sub, where) for sub in schema[keyword]]
                if all(options):
                    problems.append(f"{where}: matches none of {keyword}: "
                                    f"{'; '.join(p[0] for p in options)}")
        kind = schema.get("type")
        if kind is not None:
            if not isinstance(value, _TYPES[kind]) or (
                    kind in ("integer", "number") and isinstance(value, bool)):
                return [*problems, f"{where}: {value!r} is not of type {kind}"]
            if kind == "string" and schema.get("format") == "date-time":
                try:
                    datetime.fromisoformat(value)
                except ValueError:
                    problems.append(f"{where}: {value!r} is not a date-time")
        if "enum" in schema and value not in schema["enum"]:
            problems.append(f"{where}: {value!r} is not one of {schema['enum']}")
        if isinstance(value, dict):
            problems.extend(self._object(value, schema, where))
        if isinstance(value, list) and "items" in schema:
            for i, item in enumerate(value):
                problems.extend(self.mismatches(item, schema["items"], f"{where}[{i}]"))
        return problems

    def _object(self, value: dict[str, Any], schema: Mapping[str, Any],
                where: str) -> list[str]:
        properties = schema.get("properties", {})
        problems = [f"{where}: {name!r} is required but absent"
                    for name in schema.get("required", ()) if name not in value]
        # a serializer's object lists its properties: one it does not list is undocumented
        extra = schema.get("additionalProperties", not properties)
        for name, item in value.items():
            if name in properties:
                problems.extend(self.mismatches(item, properties[name], f"{where}.{name}"))
            elif extra is False:
                problems.append(f"{where}: {name!r} is not a documented property")
            elif isinstance(extra, dict):
                problems.extend(self.mismatches(item, extra, f"{where}.{name}"))
        return problems


def _combined(schema: Mapping[str, Any]) -> bool:
    return any(k in schema for k in ("allOf", "oneOf", "anyOf", "properties", "items", "enum"))
