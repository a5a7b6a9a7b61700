"""Validation: every mistake in a file reported at once, each starting with its path."""

from pathlib import Path

import pytest

from pycollector.config import ConfigError, load
from pycollector.config.validate import build_plan
from pycollector.testing import registry_with

from tests.components import Journal, factories

TESTDATA = Path(__file__).parent / "testdata" / "config"


def plan_of(name, env=None):
    return build_plan(load([str(TESTDATA / name)], env=env or {}), registry_with(**factories(Journal())))


def problems_of(name):
    with pytest.raises(ConfigError) as raised:
        plan_of(name)
    return raised.value.problems


def test_three_mistakes_are_all_reported_with_their_paths():
    assert problems_of("three_mistakes.yaml") == [
        "exporters::debug::sampling_initial: input should be a valid integer (got 'many')",
        "exporters::debug::verbosty: unknown key (did you mean 'verbosity'?)",
        "service::pipelines::profiles::exporters::1: references exporter 'otlp/backend', which is not defined under 'exporters'",
    ]


def test_unknown_type_lists_the_known_ones():
    [problem] = problems_of("unknown_type.yaml")
    assert problem.startswith("exporters::kafka: unknown type 'kafka' (known exporters: ")
    assert "debug" in problem and "keeper" in problem


def test_pipeline_rules():
    problems = problems_of("pipeline_rules.yaml")
    assert problems == [
        "service::extensions::1: references extension 'health_check', which is not defined under 'extensions'",
        "service::pipelines::profiles::processors::1: 'tagger' is listed twice in this pipeline",
        "service::pipelines::traces::exporters::0: exporter 'profiles_only' does not support traces (it supports: profiles)",
        "service::pipelines::logs/empty::receivers: a pipeline needs at least one receiver",
        "service::pipelines::logs/empty::exporters: a pipeline needs at least one exporter",
        "service::pipelines::spans: unknown signal 'spans' (pipelines are named signal[/name] with signal one of traces, metrics, logs, profiles)",
        "service::pipelines::metrics::extra: unknown key",
        "connectors::forward_like: a connector must be used as an exporter in one pipeline and as a receiver in another; it is never used as a receiver",
    ]


def test_go_style_config_validates_with_env_defaults():
    plan = plan_of("valid_go_style.yaml")
    assert set(plan.pipelines) == {"profiles", "profiles/enriched"}
    assert plan.component("processors", "tagger/a").config.value == "from-default"
    assert plan.component("exporters", "debug").config.verbosity == "normal"
    assert plan.telemetry.metrics.listen_address() == ("127.0.0.1", 0)


def test_environment_reaches_component_config():
    plan = build_plan(load([str(TESTDATA / "valid_go_style.yaml")], env={"TAG_A": "from-env"}), registry_with(**factories(Journal())))
    assert plan.component("processors", "tagger/a").config.value == "from-env"


def test_unknown_section_and_missing_service():
    with pytest.raises(ConfigError) as raised:
        build_plan({"exporter": {}}, registry_with())
    assert raised.value.problems == [
        "exporter: unknown section (did you mean 'exporters'?) (known: receivers, processors, exporters, extensions, connectors, service)",
        "service: required section is missing (it lists the pipelines to run)",
    ]


def test_component_config_that_is_not_a_map():
    with pytest.raises(ConfigError) as raised:
        build_plan({"exporters": {"debug": "loud"}, "service": {"pipelines": {}}}, registry_with())
    assert "exporters::debug: expected a map of settings, got 'loud'" in raised.value.problems


def test_bad_duration_names_its_key():
    from pycollector.config.model_errors import describe
    import pydantic
    from pycollector.component import ComponentConfig
    from pycollector.config.types import Duration

    class Retry(ComponentConfig):
        max_interval: Duration = 30.0

    class Exporter(ComponentConfig):
        retry_on_failure: Retry = Retry()

    with pytest.raises(pydantic.ValidationError) as raised:
        Exporter.model_validate({"retry_on_failure": {"max_interval": "30", "max_intervall": "1s"}})
    assert describe("exporters::otlp_grpc/backend", Exporter, raised.value) == [
        "exporters::otlp_grpc/backend::retry_on_failure::max_interval: invalid duration '30': use a number and a unit (ns, us, ms, s, m, h), e.g. '1m30s'",
        "exporters::otlp_grpc/backend::retry_on_failure::max_intervall: unknown key (did you mean 'max_interval'?)",
    ]


def test_metrics_address_without_host_listens_on_every_interface():
    from pycollector.config.service_model import MetricsTelemetry

    assert MetricsTelemetry(address=":8888").listen_address() == ("0.0.0.0", 8888)
    assert MetricsTelemetry().listen_address() == ("localhost", 8888)
    assert MetricsTelemetry(readers=[{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": 9000}}}}]).listen_address() == ("127.0.0.1", 9000)


def test_a_bad_prometheus_reader_port_is_a_config_error_with_its_path():
    with pytest.raises(ConfigError) as raised:
        build_plan({"service": {"pipelines": {}, "telemetry": {"metrics": {"readers": [{"pull": {"exporter": {"prometheus": {"port": "abc"}}}}]}}}}, registry_with())
    assert "service::telemetry::metrics::readers: readers[0]: pull::exporter::prometheus::port must be a port number (got 'abc')" in raised.value.problems
