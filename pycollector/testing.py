"""What pycollector's own tests use, for plugin authors to test their components the same way.

    from pycollector.testing import assert_conformance, make_settings, CapturingConsumer

    def test_my_exporter_keeps_the_contract():
        assert_conformance(my_package.factory, "exporters")
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pydantic
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from pycollector.component import KINDS, SIGNALS, Component, ComponentID, Factory, Settings
from pycollector.logs import get_logger
from pycollector.pdata import ProfilesBuilder, item_count, signal_of
from pycollector.pdata.attributes import key_values
from pycollector.pdata.serialized import as_message
from pycollector.registry import Registry
from pycollector.telemetry import Telemetry


def make_settings(kind: str = "exporters", component_id: str = "test", telemetry: Telemetry | None = None) -> Settings:
    """Settings as the engine would build them, with a private metrics registry."""
    parsed = ComponentID.parse(component_id)
    telemetry = telemetry or Telemetry()
    return Settings(parsed, kind, get_logger(component=f"{kind}::{parsed}"), telemetry.for_component(kind, str(parsed)))


def registry_with(**factories_by_kind: dict[str, Any]) -> Registry:
    """The installed plugins plus factories of this process, e.g. ``registry_with(receivers={"fake": f})``."""
    return Registry(extra=factories_by_kind)


class CapturingConsumer:
    """A next consumer that keeps what it is given; ``wait_for`` blocks until a condition holds.

    Serialized profiles are kept as the message they hold, as the engine hands them to a component
    that reads messages; ``given`` keeps each as it was given."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.given: list[Any] = []
        self._changed = threading.Condition()

    def consume(self, data: Any) -> None:
        with self._changed:
            self.given.append(data)
            self.messages.append(as_message(data))
            self._changed.notify_all()

    def items(self, signal: str | None = None) -> int:
        with self._changed:
            return sum(item_count(m) for m in self.messages if signal is None or signal_of(m) == signal)

    def wait_for(self, condition: Callable[["CapturingConsumer"], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not condition(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True


class CapturingExporterFactory(Factory):
    """An exporter type (``capture``) whose instances hand everything to ``self.consumer``:
    run a real pipeline and read what reached its end."""

    type = "capture"

    def __init__(self) -> None:
        self.consumer = CapturingConsumer()

    def create(self, settings: Settings, config: Any, next_consumer: Any) -> Component:
        consumer = self.consumer

        class CapturingExporter(Component):
            def consume(self, data: Any) -> None:
                consumer.consume(data)

        return CapturingExporter()


def receiver_of(service: Any, name: str | None = None) -> Any:
    """The running component of a service's receiver ``name`` (by default its only one, or first)."""
    return next(node.component for node in service.graph.nodes.values()
                if node.key.kind == "receivers" and (name is None or node.key.id == name))


class TestHost:
    """A host with no extensions that records fatal errors instead of stopping anything."""

    __test__ = False  # not a pytest test class

    def __init__(self, extensions: dict[str, Any] | None = None) -> None:
        self.extensions = extensions or {}
        self.fatal_errors: list[tuple[str, BaseException]] = []
        self.statuses: list[tuple[str, str, BaseException | None]] = []

    def get_extension(self, component_id: str) -> Any:
        return self.extensions.get(component_id)

    def report_fatal_error(self, source: str, error: BaseException) -> None:
        self.fatal_errors.append((source, error))

    def report_status(self, source: str, status: str, error: BaseException | None = None) -> None:
        self.statuses.append((source, status, error))


def sample_data(signal: str) -> Any:
    """A small, valid message of each signal, for lifecycle tests."""
    resource_attributes = {"service.name": "conformance", "process.pid": 4242}
    if signal == "profiles":
        builder = ProfilesBuilder()
        function = builder.function("main", filename="main.c")
        location = builder.location(lines=[(function, 10, 0)], attributes={"profile.frame.type": "native"})
        resource = builder.resource_profiles(resource_attributes)
        profile = builder.profile(builder.scope_profiles(resource, name="conformance"), period=10_000_000)
        builder.sample(profile, builder.stack([location]), [3], attributes={"thread.id": 4242})
        return builder.data
    resource = {"attributes": key_values(resource_attributes)}
    if signal == "traces":
        span = trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="work")
        return trace_pb2.TracesData(resource_spans=[{"resource": resource, "scope_spans": [{"spans": [span]}]}])
    if signal == "metrics":
        metric = metrics_pb2.Metric(name="requests", sum=metrics_pb2.Sum(data_points=[metrics_pb2.NumberDataPoint(as_int=1)]))
        return metrics_pb2.MetricsData(resource_metrics=[{"resource": resource, "scope_metrics": [{"metrics": [metric]}]}])
    if signal == "logs":
        record = logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value="hello"))
        return logs_pb2.LogsData(resource_logs=[{"resource": resource, "scope_logs": [{"log_records": [record]}]}])
    raise ValueError(f"unknown signal {signal!r}")


def assert_conformance(factory: Any, kind: str, config: dict | None = None) -> None:
    """The checks every component must pass, whatever it does.

    The factory declares what the engine needs; its defaults form a valid config; an unknown key
    is refused; create -> start -> consume (every signal it supports) -> shutdown -> shutdown works,
    and shutdown is safe on a component that never started.
    """
    assert kind in KINDS, f"kind must be one of {KINDS}"
    assert isinstance(factory.type, str) and factory.type, "factory.type must be a non-empty string"
    assert factory.signals and set(factory.signals) <= set(SIGNALS), f"factory.signals must be a subset of {SIGNALS}"
    assert isinstance(factory.config_model, type) and issubclass(factory.config_model, pydantic.BaseModel), "config_model must be a pydantic model"
    default = factory.config_model.model_validate({})
    assert factory.config_model.model_validate(default.model_dump(mode="json")) == default, "the default config must survive a dump and reload"
    try:
        factory.config_model.model_validate({"surely_not_a_key": 1})
    except pydantic.ValidationError as error:
        assert any(detail["type"] == "extra_forbidden" for detail in error.errors()), "an unknown key must be reported as unknown"
    else:
        raise AssertionError("config_model must reject unknown keys (extra='forbid'); use pycollector.component.ComponentConfig")

    parsed = factory.config_model.model_validate(config or {})
    never_started = factory.create(make_settings(kind, factory.type), parsed, CapturingConsumer())
    never_started.shutdown()

    downstream = CapturingConsumer()
    component = factory.create(make_settings(kind, factory.type), parsed, downstream)
    host = TestHost()
    component.start(host)
    try:
        if kind in ("processors", "exporters", "connectors"):
            for signal in sorted(factory.signals):
                component.consume(sample_data(signal))
    finally:
        component.shutdown()
        component.shutdown()
    assert not host.fatal_errors, f"component reported fatal errors: {host.fatal_errors}"
    if kind in ("processors", "connectors"):
        assert downstream.items() > 0, "a processor or connector must pass data on by the time it has shut down"
