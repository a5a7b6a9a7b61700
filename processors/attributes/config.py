"""Settings of the attributes processor, as the Go ``attributes`` processor's.

``include`` / ``exclude`` take Go's match properties. Implemented: ``match_type`` (strict or
regexp), ``services``, ``attributes`` and ``resources``, which every signal has. The criteria of one
signal's items (span names and kinds, log bodies and severities, metric names) and of instrumentation
libraries are refused by name rather than accepted and ignored. As in Go, a config must give at
least one action.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig, not_supported

from processors.attraction.config import ActionConfig


# Go's criteria of one signal's items and of instrumentation libraries: refused by name.
_OneSignalCriterion = not_supported("items are matched by services, attributes or resources, which every signal has")
_LibraryCriterion = not_supported("match by services, attributes or resources")


class MatchAttribute(ComponentConfig):
    key: str = pydantic.Field(min_length=1)
    # strict: the value to equal (no value: the key only has to be present);
    # regexp: a Python regular expression searched in the value's string form.
    value: Any = None


class RegexpCache(ComponentConfig):
    cacheenabled: bool = False
    cachemaxnumentries: int = 0

    @pydantic.model_validator(mode="after")
    def _a_size_when_on(self) -> "RegexpCache":
        if self.cacheenabled and self.cachemaxnumentries <= 0:
            raise ValueError("cachemaxnumentries: must provide a positive size when cacheenabled")
        return self


class MatchProperties(ComponentConfig):
    match_type: Literal["strict", "regexp"]
    # The resource's service.name is one of these.
    services: list[str] = []
    # Every one of these matches the item's attributes / its resource's attributes.
    attributes: list[MatchAttribute] = []
    resources: list[MatchAttribute] = []

    span_names: _OneSignalCriterion = None
    span_kinds: _OneSignalCriterion = None
    log_bodies: _OneSignalCriterion = None
    log_severity_texts: _OneSignalCriterion = None
    log_severity_number: _OneSignalCriterion = None
    metric_names: _OneSignalCriterion = None
    libraries: _LibraryCriterion = None
    # Go's regexp cache settings; patterns are compiled once here, so there is nothing to cache.
    regexp: RegexpCache | None = None

    @pydantic.model_validator(mode="after")
    def _some_criterion(self) -> "MatchProperties":
        # As Go: a matcher that names nothing to match is a mistake, not "match everything".
        if not (self.services or self.attributes or self.resources):
            raise ValueError("at least one of services, attributes or resources must be specified")
        return self

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



def _compile(pattern: str, where: str) -> None:
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(f"{where}: invalid regular expression: {error}") from None


class AttributesConfig(ComponentConfig):
    required_as_written = ("actions",)
    # Applied in order to the attributes of each span, log record, metric data point or profile
    # sample that include/exclude let through.
    actions: list[ActionConfig] = []
    include: MatchProperties | None = None
    exclude: MatchProperties | None = None
