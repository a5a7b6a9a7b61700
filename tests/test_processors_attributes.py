"""The resource and attributes processors and the attribute actions they share."""

from __future__ import annotations

import hashlib

import pytest
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
import requests

from pycollector.client import ClientInfo, client_context
from pycollector.config.validate import build_plan
from pycollector.pdata import ProfilesBuilder, iter_samples, key_values, to_dict, validate_indices
from pycollector.service import Service
from pycollector.testing import CapturingConsumer, CapturingExporterFactory, TestHost, make_settings, receiver_of, registry_with

from processors.attraction.actions import AttributeActions
from processors.attraction.config import ActionConfig
from processors.attributes.factory import factory as attributes_factory
from processors.resource.factory import factory as resource_factory
from tests.test_processors_support import validation_problems

PYROSCOPE_SERVICE_NAME = {"key": "service.name", "from_attribute": "process.executable.name", "action": "upsert"}


def run(factory, config: dict, data):
    """Start the processor, pass ``data`` through it, shut it down; what came out."""
    downstream = CapturingConsumer()
    processor = factory.create(make_settings("processors", factory.type), factory.config_model.model_validate(config), downstream)
    processor.start(TestHost())
    processor.consume(data)
    processor.shutdown()
    [out] = downstream.messages
    return out


def act(actions: list[dict], attributes: dict) -> dict:
    attributes = dict(attributes)
    AttributeActions([ActionConfig.model_validate(a) for a in actions]).apply(attributes)
    return attributes


def profiles_of_processes(*executables: str):
    builder = ProfilesBuilder()
    stack = builder.stack([builder.location(lines=[(builder.function("main"), 1, 0)])])
    for pid, executable in enumerate(executables, start=100):
        resource = builder.resource_profiles({"process.pid": pid, "process.executable.name": executable})
        profile = builder.profile(builder.scope_profiles(resource))
        for thread in ("main", "worker", "worker"):
            builder.sample(profile, stack, [1], attributes={"thread.name": thread, "thread.id": pid})
    return builder.data


# -- the use case: Pyroscope groups by service_name -----------------------------------------------


def test_resource_processor_sets_service_name_from_the_executable_name():
    data = profiles_of_processes("nginx", "postgres")
    data.resource_profiles[1].resource.attributes.extend(key_values({"service.name": "db"}))
    out = run(resource_factory, {"attributes": [PYROSCOPE_SERVICE_NAME]}, data)
    services = [to_dict(rp.resource.attributes)["service.name"] for rp in out.resource_profiles]
    assert services == ["nginx", "postgres"]  # upsert: inserted, and overwritten
    assert {view.resource["service.name"] for view in iter_samples(out)} == {"nginx", "postgres"}


def test_resource_processor_acts_on_every_signal():
    resource = {"attributes": key_values({"process.executable.name": "api"})}
    messages = [
        trace_pb2.TracesData(resource_spans=[{"resource": resource}]),
        metrics_pb2.MetricsData(resource_metrics=[{"resource": resource}]),
        logs_pb2.LogsData(resource_logs=[{"resource": resource}]),
    ]
    for message in messages:
        out = run(resource_factory, {"attributes": [PYROSCOPE_SERVICE_NAME, {"key": "process.executable.name", "action": "delete"}]}, message)
        [entry] = out.ListFields()[0][1]
        assert to_dict(entry.resource.attributes) == {"service.name": "api"}


# -- each action, with Go's semantics ---------------------------------------------------------


@pytest.mark.parametrize(
    "action, before, after",
    [
        ({"key": "k", "value": "new", "action": "insert"}, {"k": "old"}, {"k": "old"}),
        ({"key": "k", "value": "new", "action": "insert"}, {}, {"k": "new"}),
        ({"key": "k", "value": 7, "action": "update"}, {}, {}),
        ({"key": "k", "value": 7, "action": "update"}, {"k": "old"}, {"k": 7}),
        ({"key": "k", "from_attribute": "src", "action": "upsert"}, {"k": 1}, {"k": 1}),  # no source: nothing
        ({"key": "k", "from_attribute": "src", "action": "UPSERT"}, {"src": [1, 2]}, {"src": [1, 2], "k": [1, 2]}),
        ({"key": "k", "action": "delete"}, {"k": 1, "kk": 2}, {"kk": 2}),
        ({"pattern": "^tmp\\.", "action": "delete"}, {"tmp.a": 1, "tmp.b": 2, "keep": 3}, {"keep": 3}),
        ({"key": "user", "action": "hash"}, {"user": "alice"}, {"user": hashlib.sha256(b"alice").hexdigest()}),
        ({"key": "n", "action": "hash"}, {"n": 1}, {"n": hashlib.sha256((1).to_bytes(8, "little")).hexdigest()}),
        (
            {"key": "url", "pattern": "^/api/(?P<version>v\\d+)/(?P<resource>\\w+)", "action": "extract"},
            {"url": "/api/v2/users?id=1"},
            {"url": "/api/v2/users?id=1", "version": "v2", "resource": "users"},
        ),
        ({"key": "url", "pattern": "^(?P<a>x)", "action": "extract"}, {"url": "nope"}, {"url": "nope"}),
        ({"key": "n", "converted_type": "int", "action": "convert"}, {"n": "42"}, {"n": 42}),
        ({"key": "n", "converted_type": "int", "action": "convert"}, {"n": "4 2"}, {"n": "4 2"}),  # left as is
        ({"key": "n", "converted_type": "int", "action": "convert"}, {"n": 2.9}, {"n": 2}),
        ({"key": "n", "converted_type": "double", "action": "convert"}, {"n": True}, {"n": 1.0}),
        ({"key": "n", "converted_type": "string", "action": "convert"}, {"n": False}, {"n": "false"}),
        ({"key": "n", "converted_type": "string", "action": "convert"}, {"n": 1e21}, {"n": "1000000000000000000000"}),
    ],
)
def test_each_action_does_what_go_does(action, before, after):
    result = act([action], before)
    assert result == after
    assert [type(value) for value in result.values()] == [type(value) for value in after.values()]


def test_actions_apply_in_order():
    steps = [
        {"key": "service.name", "from_attribute": "process.executable.name", "action": "insert"},
        {"key": "service.name", "value": "fallback", "action": "insert"},
        {"key": "process.executable.name", "action": "delete"},
    ]
    assert act(steps, {"process.executable.name": "nginx"}) == {"service.name": "nginx"}
    assert act(steps, {}) == {"service.name": "fallback"}


# -- validation, per action, on the key at fault ---------------------------------------------------


@pytest.mark.parametrize(
    "action, problem",
    [
        ({"key": "k", "action": "insert"}, "value: action 'insert' needs one of value, from_attribute or from_context (or default_value)"),
        ({"key": "k", "value": 1, "from_attribute": "a", "action": "upsert"}, "value: set only one of value, from_attribute or from_context; this action sets value and from_attribute (got 1)"),
        ({"value": 1, "action": "insert"}, "key: required by action 'insert'"),
        ({"action": "delete"}, "key: action 'delete' needs a key or a pattern"),
        ({"key": "k", "value": 1, "action": "delete"}, "value: action 'delete' does not use value, from_attribute or from_context; this action sets value (got 1)"),
        ({"key": "k", "action": "extract"}, "pattern: action 'extract' needs a pattern with named groups, e.g. '(?P<name>[^/]+)'"),
        ({"key": "k", "pattern": "(?P<a>x)(y)", "action": "extract"}, "pattern: every group of an extract pattern must be named, e.g. (?P<name>...) (got '(?P<a>x)(y)')"),
        ({"key": "k", "pattern": "(", "action": "hash"}, "pattern: invalid regular expression: missing ), unterminated subpattern at position 0 (got '(')"),
        ({"key": "k", "value": 1, "pattern": "x", "action": "insert"}, "pattern: action 'insert' does not use a pattern (got 'x')"),
        ({"key": "k", "action": "convert"}, "converted_type: required by action 'convert': int, double or string"),
        ({"key": "k", "value": 1, "converted_type": "int", "action": "upsert"}, "converted_type: action 'upsert' does not use converted_type (got 'int')"),
        ({"key": "k", "action": "rename"}, "action: input should be 'insert', 'update', 'upsert', 'delete', 'hash', 'extract' or 'convert' (got 'rename')"),
        ({"key": "k", "value": 1, "action": "insert", "vaule": 2}, "vaule: unknown key (did you mean 'value'?)"),
    ],
)
def test_each_invalid_action_is_reported_on_its_index_and_key(action, problem):
    valid = {"key": "ok", "value": 1, "action": "insert"}
    assert validation_problems("resource", {"attributes": [valid, action]}) == [f"processors::resource::attributes::1::{problem}"]
    assert validation_problems("attributes", {"actions": [action]}) == [f"processors::attributes::actions::0::{problem}"]


def test_from_context_reads_the_client_that_sent_the_data():
    actions = [
        {"key": "tenant", "from_context": "metadata.x-tenant", "action": "insert"},
        {"key": "teams", "from_context": "X-Team", "action": "insert"},  # a bare key is metadata too
        {"key": "client", "from_context": "client.address", "action": "upsert"},
        {"key": "user", "from_context": "auth.subject", "action": "insert"},  # no authenticator: nothing
    ]
    client = ClientInfo("10.0.0.7", {"x-tenant": ("acme",), "x-team": ("a", "b")})
    with client_context(client):
        assert act(actions, {"client": "old"}) == {"tenant": "acme", "teams": ["a", "b"], "client": "10.0.0.7"}
    assert act(actions, {"client": "old"}) == {"client": "old"}  # no client: nothing to read


def test_request_metadata_reaches_the_resource_processor_through_the_otlp_receiver():
    capture = CapturingExporterFactory()
    config = {
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": "127.0.0.1:0", "include_metadata": True}}}},
        "processors": {"resource": {"attributes": [{"key": "tenant", "from_context": "metadata.x-tenant", "action": "insert"}]}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"traces": {"receivers": ["otlp"], "processors": ["resource"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    try:
        receiver = receiver_of(service)
        host, port = receiver.http_address
        spans = trace_pb2.TracesData(resource_spans=[{"scope_spans": [{"spans": [{"name": "s"}]}]}])
        response = requests.post(f"http://{host}:{port}/v1/traces", data=spans.SerializeToString(), headers={"Content-Type": "application/x-protobuf", "X-Tenant": "acme"}, timeout=5)
        assert response.status_code == 200
    finally:
        service.shutdown()
    [out] = capture.consumer.messages
    assert to_dict(out.resource_spans[0].resource.attributes) == {"tenant": "acme"}


# -- the attributes processor on each signal's items --------------------------------------------


def test_attributes_processor_edits_sample_attributes_through_the_dictionary():
    data = profiles_of_processes("nginx", "postgres")
    config = {"actions": [{"key": "thread.name", "action": "hash"}, {"key": "thread.kind", "value": "app", "action": "insert"}]}
    out = run(attributes_factory, config, data)
    assert validate_indices(out) == []
    hashed = {name: hashlib.sha256(name.encode()).hexdigest() for name in ("main", "worker")}
    assert [view.attributes for view in iter_samples(out)] == [
        {"thread.name": hashed[thread], "thread.id": pid, "thread.kind": "app"}
        for pid in (100, 101)
        for thread in ("main", "worker", "worker")
    ]


def test_include_and_exclude_choose_which_samples_are_acted_on():
    data = profiles_of_processes("nginx", "postgres")
    config = {
        "actions": [{"key": "picked", "value": True, "action": "insert"}],
        "include": {"match_type": "regexp", "resources": [{"key": "process.executable.name", "value": "^(nginx|postgres)$"}]},
        "exclude": {"match_type": "strict", "attributes": [{"key": "thread.name", "value": "worker"}], "resources": [{"key": "process.pid", "value": 101}]},
    }
    out = run(attributes_factory, config, data)
    picked = [(view.resource["process.pid"], view.attributes["thread.name"], view.attributes.get("picked")) for view in iter_samples(out)]
    assert picked == [
        (100, "main", True),
        (100, "worker", True),
        (100, "worker", True),
        (101, "main", True),
        (101, "worker", None),  # excluded: a worker thread of pid 101
        (101, "worker", None),
    ]


def test_services_match_the_resource_service_name_and_one_signals_criteria_are_refused_by_name():
    def spans(service: str):
        return {"resource": {"attributes": key_values({"service.name": service})}, "scope_spans": [{"spans": [{"name": "s"}]}]}

    config = {"actions": [{"key": "env", "value": "prod", "action": "upsert"}], "include": {"match_type": "strict", "services": ["checkout"]}}
    out = run(attributes_factory, config, trace_pb2.TracesData(resource_spans=[spans("checkout"), spans("cart")]))
    assert [to_dict(rs.scope_spans[0].spans[0].attributes) for rs in out.resource_spans] == [{"env": "prod"}, {}]
    # Never accepted and ignored: the user would believe it restricts what is acted on.
    for key in ("span_names", "span_kinds", "log_bodies", "log_severity_texts", "log_severity_number", "metric_names", "libraries"):
        problems = validation_problems("attributes", {**config, "exclude": {"match_type": "strict", key: ["x"]}})
        assert len(problems) == 1 and problems[0].startswith(f"processors::attributes::exclude::{key}: not supported by pycollector"), problems


def test_actions_are_required_as_in_go():
    assert validation_problems("attributes", {"include": {"match_type": "strict", "services": ["a"]}}) == [
        "processors::attributes::actions: required key is missing"]
    assert validation_problems("attributes", {"actions": []}) == ["processors::attributes::actions: required key is missing"]


def test_attributes_processor_acts_on_data_points_and_log_records():
    metric = metrics_pb2.Metric(name="m", sum=metrics_pb2.Sum(data_points=[metrics_pb2.NumberDataPoint(attributes=key_values({"code": "200"}))]))
    metrics = metrics_pb2.MetricsData(resource_metrics=[{"scope_metrics": [{"metrics": [metric]}]}])
    logs = logs_pb2.LogsData(resource_logs=[{"scope_logs": [{"log_records": [{"attributes": key_values({"code": "500"})}]}]}])
    convert = {"actions": [{"key": "code", "converted_type": "int", "action": "convert"}]}
    out_metrics, out_logs = run(attributes_factory, convert, metrics), run(attributes_factory, convert, logs)
    assert to_dict(out_metrics.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points[0].attributes) == {"code": 200}
    assert to_dict(out_logs.resource_logs[0].scope_logs[0].log_records[0].attributes) == {"code": 500}


def test_regexp_match_values_must_be_patterns():
    config = {"actions": [{"key": "k", "value": 1, "action": "insert"}], "include": {"match_type": "regexp", "attributes": [{"key": "code", "value": 5}]}}
    assert validation_problems("attributes", config) == [
        "processors::attributes::include::attributes: entry 0 (code): match_type regexp needs a string value to use as a pattern"
    ]


def test_both_processors_say_they_edit_data_in_place():
    assert resource_factory.mutates_data and attributes_factory.mutates_data


def test_default_value_and_go_named_groups_as_contrib_0_152_reads_them():
    """default_value is written when the source gives nothing (and is the value with no source);
    an extract pattern may name its groups (?<name>...) as Go's RE2 does."""
    from processors.attraction.actions import AttributeActions
    from processors.attraction.config import ActionConfig

    actions = AttributeActions([ActionConfig.model_validate(action) for action in (
        {"key": "env", "from_attribute": "deployment", "default_value": "unknown", "action": "upsert"},
        {"key": "team", "default_value": "core", "action": "insert"},
        {"key": "zone", "action": "extract", "pattern": "^(?<region>[a-z]+)-(?P<rack>[0-9]+)$"},
    )])
    missing = {"zone": "eu-12"}
    actions.apply(missing)
    assert missing == {"zone": "eu-12", "env": "unknown", "team": "core", "region": "eu", "rack": "12"}
    present = {"deployment": "prod", "team": "payments"}
    actions.apply(present)
    assert present == {"deployment": "prod", "team": "payments", "env": "prod"}
    assert validation_problems("attributes", {"actions": [{"key": "k", "action": "insert"}]}) == [
        "processors::attributes::actions::0::value: action 'insert' needs one of value, from_attribute or from_context (or default_value)"]
