"""Plugin discovery: every component, built-in or third-party, is an entry point loaded by stevedore.

Listing entry points imports nothing, so the config can be checked against the known type names
cheaply; only the types a config names are imported (a gateway config never imports bcc).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections import defaultdict
from typing import Any

import stevedore

from pycollector.component import KIND_GROUPS, KINDS, Factory


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    kind: str
    name: str  # the entry point's name: the type, or a deprecated alias of it
    target: str  # "module:attribute"
    distribution: str  # "name version"

    def describe(self) -> str:
        return f"entry point '{self.name} = {self.target}' in group '{KIND_GROUPS[self.kind]}' of distribution {self.distribution}"


class PluginError(Exception):
    """A plugin that cannot be used; the message names its distribution and entry point."""


@dataclasses.dataclass
class LoadedFactory:
    factory: Factory
    info: PluginInfo


def _distribution(entry_point: Any) -> str:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return "(unknown distribution)"
    return f"{dist.metadata['Name']} {dist.version}"


class Registry:
    """What is installed, per kind, and the factories loaded so far."""

    def __init__(self, extra: dict[str, dict[str, Factory]] | None = None) -> None:
        """``extra``: factories of this process by kind and name, beside the installed plugins
        (``pycollector.testing.registry_with`` uses it to run components under test in a graph)."""
        self._plugins: dict[str, dict[str, list[PluginInfo]]] = {}
        for kind in KINDS:
            by_name: dict[str, list[PluginInfo]] = defaultdict(list)
            # importlib.metadata keeps each entry point's distribution (stevedore's cache does not).
            for ep in importlib.metadata.entry_points(group=KIND_GROUPS[kind]):
                info = PluginInfo(kind, ep.name, ep.value, _distribution(ep))
                # The same distribution seen twice on sys.path is one plugin, not a conflict.
                if info not in by_name[ep.name]:
                    by_name[ep.name].append(info)
            self._plugins[kind] = dict(by_name)
        self._loaded: dict[tuple[str, str], LoadedFactory] = {}
        for kind, factories in (extra or {}).items():
            for name, factory in factories.items():
                info = PluginInfo(kind, name, f"{type(factory).__module__}:{type(factory).__qualname__}", "(this process)")
                self._plugins[kind][name] = [info]
                self._loaded[(kind, name)] = LoadedFactory(factory, info)

    def names(self, kind: str) -> list[str]:
        return sorted(self._plugins[kind])

    def plugins(self, kind: str) -> list[PluginInfo]:
        return [info for infos in self._plugins[kind].values() for info in infos]

    def knows(self, kind: str, name: str) -> bool:
        return name in self._plugins[kind]

    def load(self, kind: str, name: str) -> LoadedFactory:
        """Import the one plugin named ``name``; PluginError says which plugin broke and how."""
        key = (kind, name)
        if key in self._loaded:
            return self._loaded[key]
        candidates = self._plugins[kind].get(name, [])
        if not candidates:
            raise PluginError(f"unknown type '{name}'")
        if len(candidates) > 1:
            claims = "; ".join(info.describe() for info in candidates)
            raise PluginError(f"type '{name}' is claimed by more than one plugin: {claims}")
        info = candidates[0]
        failures: list[BaseException] = []
        manager = stevedore.NamedExtensionManager(
            KIND_GROUPS[kind],
            names=[name],
            on_load_failure_callback=lambda _manager, _ep, error: failures.append(error),
        )
        if failures or name not in manager.names():
            reason = f"{type(failures[0]).__name__}: {failures[0]}" if failures else "not found when loading"
            raise PluginError(f"plugin failed to import ({info.describe()}): {reason}")
        factory = manager[name].plugin
        problem = _contract_problem(factory, kind)
        if problem:
            raise PluginError(f"plugin breaks the component contract ({info.describe()}): {problem}")
        loaded = LoadedFactory(factory, info)
        self._loaded[key] = loaded
        return loaded


def _contract_problem(factory: Any, kind: str) -> str | None:
    for attribute in ("type", "signals", "config_model", "create"):
        if not hasattr(factory, attribute):
            return f"the factory has no '{attribute}'"
    if not callable(factory.create):
        return "factory.create is not callable"
    if not isinstance(factory.type, str) or not factory.type:
        return "factory.type must be a non-empty string"
    return None
