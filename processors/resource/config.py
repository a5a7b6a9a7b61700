"""Settings of the resource processor, as the Go ``resource`` processor's.

As in Go, a config must give at least one action (the default, built in code, has none).
"""

from __future__ import annotations

from pycollector.component import ComponentConfig

from processors.attraction.config import ActionConfig


class ResourceConfig(ComponentConfig):
    required_as_written = ("attributes",)
    # Applied in order to the resource attributes of every message, e.g.
    # {key: service.name, from_attribute: process.executable.name, action: upsert}.
    attributes: list[ActionConfig] = []
