"""Check a resolved config against the installed plugins and produce a ``Plan`` to build.

Every problem is collected and reported at once, each starting with its path, so one run of
``pycollector validate`` shows everything that is wrong with a file.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic

from pycollector.component import AS_WRITTEN, KINDS, SIGNALS, ComponentID
from pycollector.config import model_errors
from pycollector.config.errors import ConfigError, join_path
from pycollector.config.service_model import TelemetrySettings
from pycollector.registry import PluginError, PluginInfo, Registry

SECTIONS = (*KINDS, "service")
# `workers` is pycollector's: how many worker processes run the pipelines (pycollector.workers).
SERVICE_KEYS = ("extensions", "pipelines", "telemetry", "workers")
AUTO_WORKERS = "auto"
PIPELINE_KEYS = ("receivers", "processors", "exporters")


@dataclasses.dataclass
class ComponentSpec:
    kind: str
    id: ComponentID
    factory: Any
    plugin: PluginInfo
    config: pydantic.BaseModel

    @property
    def path(self) -> str:
        return join_path(self.kind, self.id)


@dataclasses.dataclass
class PipelineSpec:
    id: str
    signal: str
    receivers: list[str]
    processors: list[str]
    exporters: list[str]


@dataclasses.dataclass
class Plan:
    """A validated config: what to build, ready for the service graph."""

    components: dict[tuple[str, str], ComponentSpec]
    pipelines: dict[str, PipelineSpec]
    extensions: list[str]
    telemetry: TelemetrySettings
    aliases_used: list[tuple[str, str, str]]  # (path, alias, type) for deprecation logs
    # service::workers: a number of worker processes, or AUTO_WORKERS (pycollector.workers.count).
    workers: int | str = AUTO_WORKERS

    def component(self, kind: str, component_id: str) -> ComponentSpec:
        return self.components[(kind, component_id)]


def build_plan(config: dict, registry: Registry) -> Plan:
    """Validate ``config`` (the loader's output) fully; raise ConfigError with every problem."""
    return _Validator(config, registry).run()


class _Validator:
    def __init__(self, config: dict, registry: Registry):
        self.config = config
        self.registry = registry
        self.problems: list[str] = []
        self.components: dict[tuple[str, str], ComponentSpec] = {}
        self.declared: dict[str, set[str]] = {kind: set() for kind in KINDS}
        self.aliases_used: list[tuple[str, str, str]] = []

    def run(self) -> Plan:
        for section in self.config:
            if section not in SECTIONS:
                # An empty or blank key is quoted, so that the message still names it.
                place = section if isinstance(section, str) and section.strip() else repr(section)
                self.problems.append(f"{place}: unknown section{model_errors.suggestion(section, SECTIONS)} (known: {', '.join(SECTIONS)})")
        for kind in KINDS:
            for raw_id, raw_config in self._section(kind).items():
                self._component(kind, str(raw_id), raw_config)
        service = self._map(self.config.get("service"), "service")
        if "service" not in self.config:
            self.problems.append("service: required section is missing (it lists the pipelines to run)")
        for key in service:
            if key not in SERVICE_KEYS:
                self.problems.append(f"service::{key}: unknown key{model_errors.suggestion(key, SERVICE_KEYS)}")
        extensions = self._extensions(service.get("extensions"))
        pipelines = self._pipelines(service.get("pipelines"), "service" in self.config)
        self._connectors_are_used_both_ways(pipelines)
        telemetry = self._telemetry(service.get("telemetry"))
        workers = self._workers(service.get("workers", AUTO_WORKERS))
        if self.problems:
            raise ConfigError(self.problems)
        return Plan(self.components, pipelines, extensions, telemetry, self.aliases_used, workers)

    # -- sections and components -------------------------------------------------------------

    def _map(self, value: Any, path: str) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problems.append(f"{path}: expected a map, got {type(value).__name__}")
            return {}
        return value

    def _section(self, kind: str) -> dict:
        return self._map(self.config.get(kind), kind)

    def _component(self, kind: str, raw_id: str, raw_config: Any) -> None:
        component_id = ComponentID.parse(raw_id)
        path = join_path(kind, raw_id)
        self.declared[kind].add(str(component_id))
        if not component_id.type:
            self.problems.append(f"{path}: a component id is 'type' or 'type/name'; the type is empty")
            return
        if not self.registry.knows(kind, component_id.type):
            known = self.registry.names(kind)
            self.problems.append(
                f"{path}: unknown type '{component_id.type}'{model_errors.suggestion(component_id.type, known)}"
                f" (known {kind}: {', '.join(known) or 'none installed'})"
            )
            return
        try:
            loaded = self.registry.load(kind, component_id.type)
        except PluginError as error:
            self.problems.append(f"{path}: {error}")
            return
        factory = loaded.factory
        if factory.type != component_id.type:
            self.aliases_used.append((path, component_id.type, factory.type))
        try:
            config = factory.config_model.model_validate({} if raw_config is None else raw_config, context=AS_WRITTEN)
        except pydantic.ValidationError as error:
            self.problems.extend(model_errors.describe(path, factory.config_model, error))
            return
        self.components[(kind, str(component_id))] = ComponentSpec(kind, component_id, factory, loaded.info, config)

    # -- service --------------------------------------------------------------------------

    def _extensions(self, value: Any) -> list[str]:
        names = self._string_list(value, "service::extensions")
        for index, name in enumerate(names):
            if name not in self.declared["extensions"]:
                self.problems.append(f"service::extensions::{index}: references extension '{name}', which is not defined under 'extensions'")
        return names

    def _pipelines(self, value: Any, service_present: bool) -> dict[str, PipelineSpec]:
        raw = self._map(value, "service::pipelines")
        if not raw and service_present:
            self.problems.append("service::pipelines: no pipelines defined; add at least one, e.g. 'profiles: {receivers: [...], exporters: [...]}'")
        pipelines = {}
        for pipeline_id, body in raw.items():
            pipeline_id = str(pipeline_id)
            path = f"service::pipelines::{pipeline_id}"
            signal = ComponentID.parse(pipeline_id).type
            if signal not in SIGNALS:
                self.problems.append(f"{path}: unknown signal '{signal}'{model_errors.suggestion(signal, SIGNALS)} (pipelines are named signal[/name] with signal one of {', '.join(SIGNALS)})")
                continue
            body = self._map(body, path)
            for key in body:
                if key not in PIPELINE_KEYS:
                    self.problems.append(f"{path}::{key}: unknown key{model_errors.suggestion(key, PIPELINE_KEYS)}")
            lists = {key: self._string_list(body.get(key), f"{path}::{key}") for key in PIPELINE_KEYS}
            self._pipeline_members(path, signal, lists)
            pipelines[pipeline_id] = PipelineSpec(pipeline_id, signal, lists["receivers"], lists["processors"], lists["exporters"])
        return pipelines

    def _pipeline_members(self, path: str, signal: str, lists: dict[str, list[str]]) -> None:
        for role in ("receivers", "exporters"):
            if not lists[role]:
                self.problems.append(f"{path}::{role}: a pipeline needs at least one {role[:-1]}")
        # A connector stands in a pipeline's receivers or exporters list.
        kinds_for_role = {"receivers": ("receivers", "connectors"), "processors": ("processors",), "exporters": ("exporters", "connectors")}
        for role, names in lists.items():
            seen: set[str] = set()
            for index, name in enumerate(names):
                where = f"{path}::{role}::{index}"
                if name in seen:
                    self.problems.append(f"{where}: '{name}' is listed twice in this pipeline")
                    continue
                seen.add(name)
                kind = next((kind for kind in kinds_for_role[role] if name in self.declared[kind]), None)
                if kind is None:
                    declared = sorted(self.declared[role])
                    self.problems.append(
                        f"{where}: references {role[:-1]} '{name}', which is not defined under '{role}'"
                        f"{model_errors.suggestion(name, declared)}"
                    )
                    continue
                spec = self.components.get((kind, name))
                if spec is not None and signal not in spec.factory.signals:
                    self.problems.append(
                        f"{where}: {kind[:-1]} '{name}' does not support {signal} (it supports: {', '.join(sorted(spec.factory.signals))})"
                    )

    def _connectors_are_used_both_ways(self, pipelines: dict[str, PipelineSpec]) -> None:
        for name in sorted(self.declared["connectors"]):
            as_exporter = any(name in p.exporters for p in pipelines.values())
            as_receiver = any(name in p.receivers for p in pipelines.values())
            if as_exporter != as_receiver:
                missing = "receiver" if as_exporter else "exporter"
                self.problems.append(f"connectors::{name}: a connector must be used as an exporter in one pipeline and as a receiver in another; it is never used as a {missing}")

    def _telemetry(self, value: Any) -> TelemetrySettings:
        try:
            return TelemetrySettings.model_validate(value or {})
        except pydantic.ValidationError as error:
            self.problems.extend(model_errors.describe("service::telemetry", TelemetrySettings, error))
            return TelemetrySettings()

    def _workers(self, value: Any) -> int | str:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)  # (as an ${env:...} gives it)
        if value == AUTO_WORKERS or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1024):
            return value
        self.problems.append(f"service::workers: expected '{AUTO_WORKERS}' (one per core for a gateway, one for an agent) or a number from 1 to 1024, got {value!r}")
        return AUTO_WORKERS

    def _string_list(self, value: Any, path: str) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.problems.append(f"{path}: expected a list of component ids, e.g. [otlp, debug/console]")
            return []
        return value
