"""Helpers the processor tests, and the tests of components' configs, share; this module holds
no tests itself."""

from __future__ import annotations

import functools
from typing import Any

from pycollector.config import ConfigError
from pycollector.config.validate import build_plan
from pycollector.registry import Registry
from pycollector.service import Service


@functools.cache
def _registry() -> Registry:
    """One registry for every validation here: reading the installed entry points is the slow
    part of one, and the key-list tests validate a thousand configs."""
    return Registry()


def problems_of(section: str, type_: str, config: dict, signal: str = "profiles") -> list[str]:
    """What validating ``config`` for the component ``section::type_`` reports (none: []), the
    component in a ``signal`` pipeline between nop receiver and exporter (an extension in
    service::extensions, a connector only defined)."""
    pipeline = {"receivers": ["nop"], "exporters": ["nop"]}
    full = {"receivers": {"nop": {}}, "exporters": {"nop": {}}, "service": {"pipelines": {signal: pipeline}}}
    full.setdefault(section, {})[type_] = config
    if section == "extensions":
        full["service"]["extensions"] = [type_]
    elif section in ("receivers", "processors", "exporters"):
        pipeline[section] = [type_]
    try:
        build_plan(full, _registry())
    except ConfigError as error:
        return error.problems
    return []


def validation_problems(processor: str, config: dict) -> list[str]:
    """What validating ``config`` for ``processor`` in a profiles pipeline reports (none: [])."""
    return problems_of("processors", processor, config)


def component(service: Service, kind: str) -> Any:
    """The (first) running component of ``kind`` in ``service``."""
    return next(node.component for node in service.graph.nodes.values() if node.key.kind == kind)
