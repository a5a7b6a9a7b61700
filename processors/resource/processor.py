"""The resource processor: attribute actions on the resource of every message, of any signal."""

from __future__ import annotations

from typing import Any

from pycollector.component import Component, Consumer
from pycollector.pdata import resource_entries

from processors.attraction.actions import AttributeActions
from processors.resource.config import ResourceConfig


class ResourceProcessor(Component):
    def __init__(self, settings, config: ResourceConfig, next_consumer: Consumer):
        self._log = settings.logger
        self._actions = AttributeActions(config.attributes)
        self._next = next_consumer

    def start(self, host) -> None:
        self._actions.log_limits(self._log, "attributes")

    def consume(self, data: Any) -> None:
        for entry in resource_entries(data):
            self._actions.apply_to_key_values(entry.resource.attributes)
        self._next.consume(data)
