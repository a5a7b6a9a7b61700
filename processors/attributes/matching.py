"""Which items the attributes processor acts on: Go's include/exclude match properties.

An item is acted on when it matches ``include`` (if set) and does not match ``exclude`` (if set).
A block matches when every criterion it sets holds: the resource's ``service.name`` is one of
``services``; each of ``attributes`` matches the item; each of ``resources`` matches its resource.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from processors.attraction.values import as_string
from processors.attributes.config import MatchProperties

SERVICE_NAME = "service.name"

ValueTest = Callable[[Any], bool]
_ABSENT = object()


class Filter:
    def __init__(self, include: MatchProperties | None, exclude: MatchProperties | None) -> None:
        self._include = _Block(include) if include else None
        self._exclude = _Block(exclude) if exclude else None

    def __bool__(self) -> bool:
        return bool(self._include or self._exclude)

    def lets_through(self, resource: dict[str, Any], attributes: dict[str, Any]) -> bool:
        if self._include is not None and not self._include.matches(resource, attributes):
            return False
        return self._exclude is None or not self._exclude.matches(resource, attributes)


class _Block:
    def __init__(self, properties: MatchProperties) -> None:
        test = _regexp_test if properties.match_type == "regexp" else _strict_test
        self._services = [test(name) for name in properties.services]
        self._attributes = [(entry.key, test(entry.value)) for entry in properties.attributes]
        self._resources = [(entry.key, test(entry.value)) for entry in properties.resources]

    def matches(self, resource: dict[str, Any], attributes: dict[str, Any]) -> bool:
        if self._services:
            service = resource.get(SERVICE_NAME, _ABSENT)
            if service is _ABSENT or not any(test(service) for test in self._services):
                return False
        return _all_match(self._attributes, attributes) and _all_match(self._resources, resource)


def _all_match(conditions: list[tuple[str, ValueTest]], attributes: dict[str, Any]) -> bool:
    return all(key in attributes and test(attributes[key]) for key, test in conditions)


def _strict_test(expected: Any) -> ValueTest:
    if expected is None:
        return lambda value: True  # the key being present is enough
    # Compare types too: in Python True == 1 == 1.0, in OTLP they are different values.
    return lambda value: type(value) is type(expected) and value == expected


def _regexp_test(pattern: str) -> ValueTest:
    compiled = re.compile(pattern)
    return lambda value: compiled.search(as_string(value)) is not None
