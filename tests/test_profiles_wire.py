"""OTLP profiles in the layout each peer speaks (issue 18), read back with the official message
classes of each profiles.proto release (tests/official_profiles.py says where they come from).

Exporters are real and send to real servers on loopback that keep the raw bytes; the v1.9 sender
is a plain gRPC/HTTP client writing with v1.9's own classes."""

from __future__ import annotations

import gzip
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import hypothesis
import pytest
import requests
from hypothesis import strategies as st
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.config.errors import ConfigError
from pycollector.otlp import OTLP_SIGNALS, profiles_wire
from pycollector.otlp.json_codec import to_document
from pycollector.pdata.appending import shadow
from pycollector.testing import CapturingConsumer
from tests import official_profiles
from tests.test_otlp_support import build_service, component, free_port

VERSIONS = ("1.8", "1.9", "1.10")
PROFILES = OTLP_SIGNALS["profiles"]


@pytest.fixture(scope="module", autouse=True)
def _official_classes():
    if (reason := official_profiles.missing()) is not None:
        pytest.fail(reason)


def _samples(profile) -> list:
    return profile.sample if hasattr(profile, "sample") and not hasattr(profile, "samples") else profile.samples


def a_message() -> profiles_pb2.ProfilesData:
    """Samples of every shape a profiler sends: values with attributes and a link, timestamps
    only (as the OTel eBPF profiler sends CPU samples), several values; a profile with an id,
    attributes and a dropped count."""
    data = profiles_pb2.ProfilesData()
    d = data.dictionary
    d.string_table.extend(["", "samples", "count", "cpu", "nanoseconds", "thread.name", "a", "b"])
    d.attribute_table.add()
    for value in ("a", "b", "c"):
        d.attribute_table.add(key_strindex=5).value.string_value = value
    d.link_table.add()
    d.link_table.add(trace_id=bytes(range(16)), span_id=bytes(range(8)))
    d.mapping_table.add()
    d.function_table.add()
    d.function_table.add(name_strindex=6)
    d.location_table.add()
    d.location_table.add(address=0x1234).lines.add(function_index=1, line=7)
    d.stack_table.add()
    d.stack_table.add(location_indices=[1])
    resource = data.resource_profiles.add()
    resource.resource.attributes.add(key="process.pid").value.int_value = 42
    profile = resource.scope_profiles.add().profiles.add(period=10_000_000, profile_id=bytes(range(16)), dropped_attributes_count=2)
    profile.sample_type.type_strindex, profile.sample_type.unit_strindex = 1, 2
    profile.period_type.type_strindex, profile.period_type.unit_strindex = 3, 4
    profile.attribute_indices.extend([1])
    profile.samples.add(stack_index=1, values=[7], attribute_indices=[1, 2], link_index=1)
    profile.samples.add(stack_index=1, attribute_indices=[3], timestamps_unix_nano=[1_000, 2_000, 3_000])
    profile.samples.add(stack_index=1, values=[300_000_000_000], attribute_indices=[2])
    return data


def assert_same(ours: profiles_pb2.ProfilesData, theirs) -> None:
    """Every sample, value, attribute, link and profile field of ``ours`` as ``theirs`` (a
    message of another layout's classes) holds it."""
    assert theirs.dictionary.SerializeToString() == ours.dictionary.SerializeToString()
    for resource, their_resource in zip(ours.resource_profiles, theirs.resource_profiles, strict=True):
        for scope, their_scope in zip(resource.scope_profiles, their_resource.scope_profiles, strict=True):
            for profile, their_profile in zip(scope.profiles, their_scope.profiles, strict=True):
                for field in ("profile_id", "dropped_attributes_count", "period", "time_unix_nano", "duration_nano"):
                    assert getattr(their_profile, field) == getattr(profile, field), field
                assert list(their_profile.attribute_indices) == list(profile.attribute_indices)
                assert their_profile.sample_type.type_strindex == profile.sample_type.type_strindex
                samples = _samples(their_profile)
                assert [
                    (s.stack_index, list(s.values), list(s.attribute_indices), s.link_index, list(s.timestamps_unix_nano))
                    for s in samples
                ] == [
                    (s.stack_index, list(s.values), list(s.attribute_indices), s.link_index, list(s.timestamps_unix_nano))
                    for s in profile.samples
                ]


# -- what the exporters send ------------------------------------------------------------------


class RawGrpcBackend:
    """Accepts profiles over gRPC and keeps each request's bytes as they came."""

    def __init__(self):
        self.bodies: list[bytes] = []
        self.arrived = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def export(request: bytes, context):
            self.bodies.append(request)
            self.arrived.set()
            return PROFILES.response_type()

        handler = grpc.unary_unary_rpc_method_handler(export, response_serializer=PROFILES.response_type.SerializeToString)
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(PROFILES.service, {"Export": handler})])
        self.endpoint = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop(0).wait()


class RawHttpBackend:
    """Answers every POST with ``status`` and ``text``, keeping each (content type, body)."""

    def __init__(self, status: int = 200, text: str = ""):
        self.bodies: list[tuple[str, bytes]] = []
        self.arrived = threading.Event()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                backend.bodies.append((self.headers["Content-Type"], body))
                backend.arrived.set()
                answer = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _run_exporter(exporter_id: str, config: dict, data) -> None:
    """A service whose only pipeline ends in ``exporter_id``; ``data`` pushed through it."""
    service = build_service(
        {
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{free_port()}"}}}},
            "exporters": {exporter_id: config},
            "service": {"pipelines": {"profiles": {"receivers": ["otlp"], "exporters": [exporter_id]}}},
        }
    )
    service.start()
    try:
        component(service, "receivers", "otlp")._delivery(data)
    finally:
        service.shutdown()


@pytest.mark.parametrize("version", VERSIONS)
def test_otlp_grpc_exporter_writes_the_layout_it_is_set_to(version):
    official = official_profiles.layout(version)
    with RawGrpcBackend() as backend:
        _run_exporter("otlp_grpc", {"endpoint": backend.endpoint, "tls": {"insecure": True}, "profiles_wire_version": version}, a_message())
        assert backend.arrived.wait(10)
    assert_same(a_message(), official.ProfilesData.FromString(backend.bodies[0]))
    if version != "1.10":  # read as the current layout, the same bytes lose values: the misread
        with pytest.raises(AssertionError):
            assert_same(a_message(), profiles_pb2.ProfilesData.FromString(backend.bodies[0]))


@pytest.mark.parametrize("encoding", ["proto", "json"])
@pytest.mark.parametrize("version", VERSIONS)
def test_otlp_http_exporter_writes_the_layout_it_is_set_to(version, encoding):
    official = official_profiles.layout(version)
    with RawHttpBackend() as backend:
        config = {"endpoint": backend.endpoint, "encoding": encoding, "profiles_wire_version": version}
        _run_exporter("otlp_http", config, a_message())
        assert backend.arrived.wait(10)
    content_type, body = backend.bodies[0]
    if encoding == "json":
        from google.protobuf import json_format

        from pycollector.otlp.json_codec import parse_document, _convert_ids, _hex_to_base64

        document = parse_document(body)
        _convert_ids(document, _hex_to_base64)
        received = json_format.ParseDict(document, official.ProfilesData())  # unknown names fail here
    else:
        received = official.ProfilesData.FromString(body)
    assert content_type == ("application/json" if encoding == "json" else "application/x-protobuf")
    assert_same(a_message(), received)


@pytest.mark.parametrize("version", VERSIONS)
def test_file_exporter_writes_the_layout_it_is_set_to(tmp_path, version):
    path = tmp_path / "profiles.bin"
    _run_exporter("file", {"path": str(path), "format": "proto", "profiles_wire_version": version}, a_message())
    raw = path.read_bytes()
    length = int.from_bytes(raw[:4], "big")
    assert len(raw) == 4 + length
    assert_same(a_message(), official_profiles.layout(version).ProfilesData.FromString(raw[4:]))


def test_a_refusal_that_reads_like_a_layout_mismatch_names_the_setting(log_output):
    # Pyroscope 1.18 reading v1.10 bytes as v1.9 finds attribute indices where values should be.
    with RawHttpBackend(status=500, text="sample values length mismatch: expected 1, got 2") as backend:
        _run_exporter("otlp_http", {"endpoint": backend.endpoint, "retry_on_failure": {"enabled": False}}, a_message())
        assert backend.arrived.wait(10)
    logged = log_output.getvalue()
    assert "profiles_wire_version: '1.9'" in logged
    assert "exporters::otlp_http::profiles_wire_version" in logged


# -- what the receiver reads ------------------------------------------------------------------


def _v1_9_sender_message():
    """What the OTel eBPF profiler (v1.9) sends: samples with attributes and timestamps and no
    values, one with a value, written with v1.9's own classes."""
    v19 = official_profiles.layout("1.9")
    ours = a_message()
    return ours, v19.ProfilesData.FromString(profiles_wire.to_wire(ours.SerializeToString(), profiles_wire.LAYOUTS["1.9"]))


@pytest.fixture
def gateway():
    """otlp receiver (recognizing layouts) -> otlp_grpc exporter writing v1.10 -> a raw backend."""
    with RawGrpcBackend() as backend:
        grpc_port, http_port = free_port(), free_port()
        service = build_service(
            {
                "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"}, "http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
                "exporters": {"otlp_grpc": {"endpoint": backend.endpoint, "tls": {"insecure": True}}},
                "service": {"pipelines": {"profiles": {"receivers": ["otlp"], "exporters": ["otlp_grpc"]}}},
            }
        )
        service.start()
        try:
            yield backend, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}{PROFILES.http_path}"
        finally:
            service.shutdown()


@pytest.mark.usefixtures("profiles_codec")  # recognized by the C extension and in Python alike
def test_a_v1_9_sender_reaches_a_v1_10_exporter_intact_over_grpc(gateway):
    backend, grpc_endpoint, _ = gateway
    ours, theirs = _v1_9_sender_message()
    with grpc.insecure_channel(grpc_endpoint) as channel:
        channel.unary_unary(PROFILES.grpc_method, request_serializer=lambda m: m.SerializeToString(), response_deserializer=PROFILES.response_type.FromString)(theirs, timeout=10)
    assert backend.arrived.wait(10)
    assert_same(ours, official_profiles.layout("1.10").ProfilesData.FromString(backend.bodies[0]))


@pytest.mark.parametrize("version", ["1.8", "1.9"])
@pytest.mark.usefixtures("profiles_codec")  # recognized by the C extension and in Python alike
def test_an_older_sender_reaches_a_v1_10_exporter_intact_over_http(gateway, version):
    backend, _, url = gateway
    ours = a_message()
    theirs = official_profiles.layout(version).ProfilesData.FromString(profiles_wire.to_wire(ours.SerializeToString(), profiles_wire.LAYOUTS[version]))
    answer = requests.post(url, data=theirs.SerializeToString(), headers={"Content-Type": "application/x-protobuf"}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert backend.arrived.wait(10)
    assert_same(ours, official_profiles.layout("1.10").ProfilesData.FromString(backend.bodies[0]))


def test_a_v1_8_json_sender_is_read_by_its_names(gateway):
    backend, _, url = gateway
    ours = a_message()
    theirs = official_profiles.layout("1.8").ProfilesData.FromString(profiles_wire.to_wire(ours.SerializeToString(), profiles_wire.LAYOUTS["1.8"]))
    document = to_document(theirs)  # OTLP/JSON: hex ids
    assert "sample" in document["resourceProfiles"][0]["scopeProfiles"][0]["profiles"][0]
    answer = requests.post(url, json=document, timeout=10)
    assert answer.status_code == 200, answer.text
    assert backend.arrived.wait(10)
    received = official_profiles.layout("1.10").ProfilesData.FromString(backend.bodies[0])
    assert_same(ours, received)


@pytest.mark.usefixtures("profiles_codec")  # recognized by the C extension and in Python alike
def test_a_v1_7_body_is_refused_with_the_reason(gateway):
    _, grpc_endpoint, url = gateway
    v17 = official_profiles.layout("1.7")
    old = v17.ProfilesData()
    old.dictionary.string_table.extend(["", "thread.name"])
    old.dictionary.attribute_table.add(key="thread.name").value.string_value = "main"
    profile = old.resource_profiles.add().scope_profiles.add().profiles.add(location_indices=[1, 2])
    profile.sample.add(locations_start_index=0, locations_length=2, value=[5], attribute_indices=[0])
    answer = requests.post(url, data=old.SerializeToString(), headers={"Content-Type": "application/x-protobuf"}, timeout=10)
    assert answer.status_code == 400
    assert "v1.7" in answer.text
    with grpc.insecure_channel(grpc_endpoint) as channel:
        call = channel.unary_unary(PROFILES.grpc_method, request_serializer=lambda m: m.SerializeToString(), response_deserializer=PROFILES.response_type.FromString)
        with pytest.raises(grpc.RpcError) as refused:
            call(old, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "v1.7" in refused.value.details()


# -- recognizing and converting -----------------------------------------------------------------

_index = st.integers(min_value=0, max_value=40)


@st.composite
def _sample(draw, attributes: int) -> dict:
    """A sample as the spec allows it: attribute indices inside the table, and one value (one
    sample type) or no value and timestamps."""
    value = draw(st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1)))
    timestamps = draw(st.lists(st.integers(min_value=0, max_value=2**64 - 1), min_size=0 if value is not None else 1, max_size=3))
    return {
        "stack_index": draw(_index),
        "attribute_indices": draw(st.lists(st.integers(min_value=0, max_value=max(attributes, 1) - 1), max_size=4)),
        "link_index": draw(_index),
        "values": [] if value is None else [value],
        "timestamps_unix_nano": timestamps,
    }


@st.composite
def _message_parts(draw) -> tuple[int, list[dict]]:
    attributes = draw(st.integers(min_value=0, max_value=30))
    return attributes, draw(st.lists(_sample(attributes), max_size=6))


def _tells_nothing(sample: dict, attributes: int) -> bool:
    """The one sample shape whose layout no byte tells (see recognize's docstring)."""
    one_number = (sample["values"] and not sample["attribute_indices"]) or (len(sample["attribute_indices"]) == 1 and not sample["values"])
    number = (sample["values"] or sample["attribute_indices"] or [None])[0]
    return bool(one_number and not sample["link_index"] and sample["timestamps_unix_nano"] and 0 <= number < attributes)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    parts=_message_parts(),
    profile_id=st.sampled_from([b"", bytes(range(16))]),
    dropped=_index,
    profile_attributes=st.lists(_index, max_size=3),
)
@pytest.mark.usefixtures("profiles_codec")  # recognized by the C extension and in Python alike
def test_every_layout_round_trips_and_reads_officially(parts, profile_id, dropped, profile_attributes):
    attributes, samples = parts
    data = profiles_pb2.ProfilesData()
    for _ in range(attributes):
        data.dictionary.attribute_table.add()
    profile = data.resource_profiles.add().scope_profiles.add().profiles.add(profile_id=profile_id, dropped_attributes_count=dropped, attribute_indices=profile_attributes)
    for sample in samples:
        profile.samples.add(**sample)
    serialized = data.SerializeToString()
    for version in VERSIONS:
        layout = profiles_wire.LAYOUTS[version]
        written = profiles_wire.to_wire(serialized, layout)
        assert_same(data, official_profiles.layout(version).ProfilesData.FromString(written))
        # Told the layout, the receiver reads it back exactly; recognizing it too, unless no
        # sample tells (then it takes the current layout, and is right for v1.10).
        assert profiles_wire.from_wire(written, layout)[0] == serialized
        back, recognized, _ = profiles_wire.from_wire(written)
        if back != serialized:
            assert all(_tells_nothing(sample, max(attributes, 1)) for sample in samples), f"written as v{version}, read as {recognized}"
            assert recognized == profiles_wire.CURRENT


@pytest.mark.usefixtures("profiles_codec")  # recognized by the C extension and in Python alike
def test_recognizing_tells_the_layouts_apart_by_their_shapes():
    message = a_message().SerializeToString()
    for version in VERSIONS:
        assert profiles_wire.recognize(profiles_wire.to_wire(message, profiles_wire.LAYOUTS[version])) == profiles_wire.LAYOUTS[version]


def test_v1_8_comments_and_temporality_are_left_out_and_counted():
    v18 = official_profiles.layout("1.8")
    old = v18.ProfilesData()
    old.dictionary.string_table.extend(["", "a comment"])
    profile = old.resource_profiles.add().scope_profiles.add().profiles.add(comment_strindices=[1], profile_id=bytes(16))
    profile.sample_type.aggregation_temporality = 1
    profile.sample.add(stack_index=0, values=[3])
    converted, layout, dropped = profiles_wire.from_wire(old.SerializeToString())
    assert layout == profiles_wire.LAYOUTS["1.8"]
    assert (dropped.profile_comments, dropped.aggregation_temporalities) == (1, 1)
    current = profiles_pb2.ProfilesData.FromString(converted).resource_profiles[0].scope_profiles[0].profiles[0]
    assert current.profile_id == bytes(16) and list(current.samples[0].values) == [3]


@pytest.mark.usefixtures("profiles_codec")  # recognized by the C extension and in Python alike
def test_truncated_bytes_are_refused_with_a_reason():
    written = profiles_wire.to_wire(a_message().SerializeToString(), profiles_wire.LAYOUTS["1.9"])
    with pytest.raises(ValueError):
        profiles_wire.from_wire(written[: len(written) // 2])


# -- settings and the batch's field numbers -------------------------------------------------------


def test_an_unquoted_1_10_in_yaml_gets_the_fix(tmp_path, cli):
    config = tmp_path / "c.yaml"
    config.write_text(
        "receivers: {otlp: {protocols: {grpc: }, profiles_wire_version: 1.9}}\n"
        "exporters: {otlp_grpc: {endpoint: 'backend:4317', profiles_wire_version: 1.10, tls: {insecure: true}}}\n"
        "service: {pipelines: {profiles: {receivers: [otlp], exporters: [otlp_grpc]}}}\n"
    )
    result = cli("validate", "--config", str(config))
    assert result.returncode != 0
    assert "exporters::otlp_grpc::profiles_wire_version" in result.stderr + result.stdout
    assert "'1.10' in quotes" in result.stderr + result.stdout
    assert "receivers::otlp" not in result.stderr + result.stdout  # an unquoted 1.9 is fine


def test_the_batch_field_numbers_are_checked_against_a_layout():
    assert shadow.mismatches() == []
    v19 = official_profiles.layout("1.9")
    problems = shadow.mismatches(mirrors={"SampleColumns": v19.Sample})
    assert any("attribute_indices: 2 here, 3 installed" in problem for problem in problems)
