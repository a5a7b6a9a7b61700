"""Helpers the processor tests share; this module holds no tests itself."""

from __future__ import annotations

from typing import Any

from pycollector.config import ConfigError
from pycollector.config.validate import build_plan
from pycollector.registry import Registry
from pycollector.service import Service


def validation_problems(processor: str, config: dict) -> list[str]:
    """What validating ``config`` for ``processor`` in a profiles pipeline reports (none: [])."""
    full = {
        "receivers": {"profiling": {}},
        "processors": {processor: config},
        "exporters": {"debug": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "processors": [processor], "exporters": ["debug"]}}},
    }
    try:
        build_plan(full, Registry())
    except ConfigError as error:
        return error.problems
    return []


def component(service: Service, kind: str) -> Any:
    """The (first) running component of ``kind`` in ``service``."""
    return next(node.component for node in service.graph.nodes.values() if node.key.kind == kind)
