"""Settings of the attributes processor, as the Go ``attributes`` processor's.

``include`` / ``exclude`` take Go's match properties. Implemented: ``match_type`` (strict or
regexp), ``services``, ``attributes`` and ``resources``; the other criteria are accepted and logged
once as not implemented (``MatchProperties.not_implemented``), and then do not restrict anything.
Go requires at least one action; an empty list is accepted here (the engine requires the defaults
to form a valid config) and the processor then passes data through, with a warning.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig

from processors.attraction.config import ActionConfig


class MatchAttribute(ComponentConfig):
    key: str
    # strict: the value to equal (no value: the key only has to be present);
    # regexp: a Python regular expression searched in the value's string form.
    value: Any = None


class MatchProperties(ComponentConfig):
    match_type: Literal["strict", "regexp"]
    # The resource's service.name is one of these.
    services: list[str] = []
    # Every one of these matches the item's attributes / its resource's attributes.
    attributes: list[MatchAttribute] = []
    resources: list[MatchAttribute] = []

    # Accepted for Go configs, not implemented (see not_implemented()).
    span_names: list[str] = []
    span_kinds: list[str] = []
    log_bodies: list[str] = []
    log_severity_texts: list[str] = []
    log_severity_number: dict[str, Any] | None = None
    metric_names: list[str] = []
    libraries: list[dict[str, Any]] = []
    # Go's regexp cache settings; patterns are compiled once here, so there is nothing to cache.
    regexp: dict[str, Any] | None = None

    @pydantic.field_validator("services")
    @classmethod
    def _services_compile(cls, services: list[str], info: pydantic.ValidationInfo) -> list[str]:
        if info.data.get("match_type") == "regexp":
            for index, pattern in enumerate(services):
                _compile(pattern, f"entry {index}")
        return services

    @pydantic.field_validator("attributes", "resources")
    @classmethod
    def _values_compile(
        cls, entries: list[MatchAttribute], info: pydantic.ValidationInfo
    ) -> list[MatchAttribute]:
        if info.data.get("match_type") == "regexp":
            for index, entry in enumerate(entries):
                where = f"entry {index} ({entry.key})"
                if not isinstance(entry.value, str):
                    raise ValueError(f"{where}: match_type regexp needs a string value to use as a pattern")
                _compile(entry.value, where)
        return entries

    def not_implemented(self) -> list[str]:
        return [key for key in NOT_IMPLEMENTED if getattr(self, key)]


NOT_IMPLEMENTED = (
    "span_names",
    "span_kinds",
    "log_bodies",
    "log_severity_texts",
    "log_severity_number",
    "metric_names",
    "libraries",
)


def _compile(pattern: str, where: str) -> None:
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(f"{where}: invalid regular expression: {error}") from None


class AttributesConfig(ComponentConfig):
    # Applied in order to the attributes of each span, log record, metric data point or profile
    # sample that include/exclude let through.
    actions: list[ActionConfig] = []
    include: MatchProperties | None = None
    exclude: MatchProperties | None = None
