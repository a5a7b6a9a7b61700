"""Settings of the resource processor, as the Go ``resource`` processor's.

Go requires at least one action; an empty list is accepted here (the engine requires the
defaults to form a valid config) and the processor then passes data through, with a warning.
"""

from __future__ import annotations

from pycollector.component import ComponentConfig

from processors.attraction.config import ActionConfig


class ResourceConfig(ComponentConfig):
    # Applied in order to the resource attributes of every message, e.g.
    # {key: service.name, from_attribute: process.executable.name, action: upsert}.
    attributes: list[ActionConfig] = []
