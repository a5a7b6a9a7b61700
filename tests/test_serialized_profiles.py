"""Serialized profiles (issue 29): the C extension appends a message's bytes to a batch exactly as
``appending.append`` appends the message, recognizes layouts as ``recognize.py`` does, refuses
what the Python path refuses, and never crashes on bytes a peer made up."""

from __future__ import annotations

import importlib

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from google.protobuf.message import DecodeError
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.otlp.profiles_wire import UnplaceableProfiles, WireError
from pycollector.pdata import appending, sample_count, serialized, validate_indices
from pycollector.pdata.serialized import SerializedProfiles
from pycollector.pdata.serialized import schema
from pycollector.pdata.serialized.batch import SerializedBatch
from pycollector.pdata.zero_entries import TABLES
from bench import agent_reports
from tests.test_otlp_pipeline import wait_for_series
from tests.test_otlp_support import GrpcBackend, a_profile, export_grpc, free_port, sample_tuples
from tests.test_pdata import (
    _build,
    _completed,
    _inputs,
    _leave_out,
    _one_sample_data,
    _serialized_samples,
    _with_bad_index,
    _with_links,
)


# The module, which the package's function of the same name hides.
recognizing = importlib.import_module("pycollector.otlp.profiles_wire.recognize")


@pytest.fixture(autouse=True)
def _c_extension(monkeypatch):
    """Everything here is the C extension's, checked against the Python path: it must be built."""
    if serialized._native is None:
        pytest.fail("pycollector.pdata.serialized._native is not built: pip install -e . builds it")
    monkeypatch.setattr(serialized, "native", serialized._native)


def batched(*messages) -> profiles_pb2.ProfilesData:
    batch = SerializedBatch()
    for message in messages:
        batch.append(message.SerializeToString())
    out = batch.profiles()
    assert out.samples == sum(sample_count(message) for message in messages)
    return profiles_pb2.ProfilesData.FromString(out.serialized)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(inputs=_inputs, left_out=st.lists(st.sampled_from(TABLES), unique=True), first_empty=st.booleans())
def test_a_batch_of_bytes_is_the_message_append_builds(inputs, left_out, first_empty):
    parts = [_leave_out(_with_links(_build(resources), seed), left_out) for seed, resources in enumerate(inputs)]
    if first_empty:
        parts.insert(0, profiles_pb2.ProfilesData())
    expected = profiles_pb2.ProfilesData()
    expected.CopyFrom(parts[0])
    for part in parts[1:]:
        appending.append(expected, part)
    # A table a sender left out holds its zero entry: the batch writes it where the message held
    # as it came leaves it out.
    assert _completed(batched(*parts)) == _completed(expected)
    assert validate_indices(batched(*parts)) == []


def test_a_first_entry_that_is_not_the_zero_value_still_means_what_it_says():
    odd = _one_sample_data("work", "main")
    odd.dictionary.string_table[0] = "zero"
    odd.dictionary.link_table[0].trace_id = b"t" * 16
    plain = _one_sample_data("idle", "main")
    for parts in ((plain, odd), (odd, plain), (odd, odd)):
        merged = batched(*parts)
        assert validate_indices(merged) == []
        assert _serialized_samples(merged) == [s for part in parts for s in _serialized_samples(part)]


def test_fields_it_does_not_know_and_unpacked_indices_are_read_as_protobuf_reads_them():
    data = _one_sample_data("work", "main")
    stacks = list(data.dictionary.stack_table)
    del data.dictionary.stack_table[:]
    entries = [stack.SerializeToString() for stack in stacks]
    # The last stack's location_indices one by one (wire type 0) rather than packed, the stacks in
    # a second occurrence of the dictionary field, and an unknown field (127) at the top: protobuf
    # reads all three, so append must.
    entries[-1] = b"".join(b"\x08" + bytes([index]) for index in stacks[-1].location_indices)
    table = b"".join(b":" + bytes([len(entry)]) + entry for entry in entries)  # ':' is field 7's key
    raw = data.SerializeToString() + b"\x12" + bytes([len(table)]) + table + b"\xf8\x07\x05"
    restored = profiles_pb2.ProfilesData.FromString(raw)
    idle = _one_sample_data("idle", "main")
    merged = batched(idle, restored)
    appending.append(expected := profiles_pb2.ProfilesData.FromString(idle.SerializeToString()), restored)
    assert merged == expected
    assert _serialized_samples(merged)[1] == _serialized_samples(restored)[0]


@pytest.mark.parametrize(
    "field",
    ["stack_index", "link_index", "samples[0].attribute_indices", "profiles[0].attribute_indices", "sample_type.unit_strindex",
     "location_indices", "function_index", "mapping_index", "location_table[1].attribute_indices", "name_strindex",
     "filename_strindex", "key_strindex"],
)
def test_an_index_outside_its_table_is_refused_as_append_refuses_it_and_the_batch_stays(field):
    batch = SerializedBatch()
    batch.append(_one_sample_data("idle", "main").SerializeToString())
    before = batch.profiles().serialized
    bad = _with_bad_index(field)
    with pytest.raises(ValueError) as native_error:
        batch.append(bad.SerializeToString())
    with pytest.raises(ValueError) as python_error:
        appending.append(_one_sample_data("idle", "main"), bad)
    assert str(native_error.value) == str(python_error.value)
    assert batch.profiles().serialized == before and batch.samples == 1


def test_bytes_cut_short_are_refused_saying_they_cannot_be_read():
    whole = _one_sample_data("work", "main").SerializeToString()
    for end in (1, len(whole) // 2, len(whole) - 1):
        with pytest.raises(ValueError, match="could not be read"):
            SerializedBatch().append(whole[:end])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(noise=st.binary(max_size=300), cut=st.integers(0, 400), data=st.data())
@example(noise=b"\x12\xff\xff\xff\xff\x0f", cut=0, data=None)
@example(noise=b"\x0a\x02\x12\x00" * 100, cut=0, data=None)
def test_made_up_bytes_are_read_or_refused_never_crash(noise, cut, data):
    """What a peer sends is input from anyone: made-up bytes, and a real message with bytes
    flipped, are appended only when they read as what they are."""
    real = bytearray(_one_sample_data("work", "main").SerializeToString())
    if data is not None and real:
        for _ in range(data.draw(st.integers(0, 3))):
            real[data.draw(st.integers(0, len(real) - 1))] = data.draw(st.integers(0, 255))
    for candidate in (noise, bytes(real[: cut or None])):
        batch = SerializedBatch()
        try:
            samples = batch.append(candidate)
        except ValueError:
            continue
        try:
            parsed = profiles_pb2.ProfilesData.FromString(candidate)
        except DecodeError:
            continue  # a message protobuf refuses; the receiver parses every request before this
        assert samples == sample_count(parsed)
        assert validate_indices(parsed) == []  # what it appended had every index inside its table


def _evidence(body: bytes):
    python = recognizing._python_evidence(body)
    return python.sample, python.profile, python.samples_seen


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(inputs=_inputs, noise=st.binary(max_size=64), where=st.integers(0, 1000))
def test_recognizing_in_c_gathers_what_the_python_walk_gathers(inputs, noise, where):
    body = _build(inputs[0]).SerializeToString()
    for candidate in (body, body[:where] + noise + body[where:], noise):
        try:
            expected = _evidence(candidate)
        except (UnplaceableProfiles, WireError):
            assert serialized.native.recognize(candidate) is None
            continue
        native = recognizing._native_evidence(candidate)
        assert native is not None and (native.sample, native.profile, native.samples_seen) == expected


def test_a_key_beyond_32_bits_is_refused_by_both_walks():
    """Protobuf's keys are 32-bit varints: a longer one (here a six-byte key of a fixed32 field,
    from noise hypothesis found) is malformed for the C walk, and was a field numbered
    363,899,000,516 for the Python one."""
    body = bytes.fromhex("a5ecc284dd54") + bytes.fromhex("7c2c7519")
    with pytest.raises(WireError, match="a field numbered 363899000516"):
        _evidence(body)
    assert serialized.native.recognize(body) is None


def test_serialized_profiles_answer_as_their_message_would():
    message = _one_sample_data("work", "main")
    profiles = SerializedProfiles(message.SerializeToString(), sample_count(message))
    assert profiles.ByteSize() == message.ByteSize()
    assert profiles.SerializeToString() == message.SerializeToString()
    assert profiles.DESCRIPTOR.full_name == "opentelemetry.proto.profiles.v1development.ProfilesData"
    first, second = profiles.to_message(), profiles.to_message()
    assert first == second == message and first is not second  # each caller's own to edit


# -- validate: the receiver's check is protobuf's -------------------------------------------------


def _reads(body: bytes):
    """What protobuf's parser makes of ``body``: its sample count, or None when it refuses it."""
    try:
        return sample_count(profiles_pb2.ProfilesData.FromString(body))
    except DecodeError:
        return None


def _nested_any_value(depth: int) -> profiles_pb2.ProfilesData:
    data = _one_sample_data("work", "main")
    value = data.resource_profiles[0].resource.attributes.add(key="deep").value
    for _ in range(depth):
        value = value.array_value.values.add()
    value.string_value = "bottom"
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), agent_report=st.integers(0, 1000))
@example(data=None, agent_report=0)
def test_the_receivers_check_accepts_and_counts_what_protobuf_reads(data, agent_report):
    """``read`` says yes (and how many samples) where protobuf's parser reads the bytes, and
    refuses, saying why, where it does not: on real agent reports with bytes flipped or cut."""
    reports = agent_reports.load()
    body = bytearray(reports[agent_report % len(reports)])
    if data is not None:
        for _ in range(data.draw(st.integers(0, 4))):
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
        body = body[: data.draw(st.integers(1, len(body)))]
    expected = _reads(bytes(body))
    native_answer = serialized.native.validate(bytes(body), serialized._SCHEMA, serialized._SAMPLE)
    assert native_answer is None or native_answer == expected  # sure only where protobuf agrees
    if expected is None:
        with pytest.raises(ValueError):
            serialized.read(bytes(body))
    else:
        assert serialized.read(bytes(body)).samples == expected


def test_strings_are_checked_as_utf_8_as_protobuf_checks_them():
    valid = _one_sample_data("work", "main").SerializeToString()
    assert serialized.native.validate(valid, serialized._SCHEMA, serialized._SAMPLE) == 1
    # A string table entry that is not UTF-8 (a surrogate, an overlong '/', a lone continuation
    # byte, past U+10FFFF): protobuf refuses each, and so does the check, without the parser.
    for bad in (b"\xed\xa0\x80", b"\xc0\xaf", b"\x80", b"ok\xf4\x90\x80\x80"):
        entry = b"\x2a" + bytes([len(bad)]) + bad  # string_table (5), length-delimited
        body = valid + b"\x12" + bytes([len(entry)]) + entry
        assert _reads(body) is None
        assert serialized.native.validate(body, serialized._SCHEMA, serialized._SAMPLE) is None
        with pytest.raises(ValueError, match="(?i)utf-?8|parse|decode"):
            serialized.read(body)
    for good in ("/usr/lib/libc.so.6", "naïve", "日本語", "🔥"):
        entry = b"\x2a" + bytes([len(good.encode())]) + good.encode()
        body = valid + b"\x12" + bytes([len(entry)]) + entry
        assert serialized.native.validate(body, serialized._SCHEMA, serialized._SAMPLE) == 1 == _reads(body)


def test_nesting_past_what_the_check_follows_is_left_to_protobuf():
    shallow, deep = _nested_any_value(10).SerializeToString(), _nested_any_value(40).SerializeToString()  # 85 messages deep
    assert serialized.native.validate(shallow, serialized._SCHEMA, serialized._SAMPLE) == 1
    assert serialized.native.validate(deep, serialized._SCHEMA, serialized._SAMPLE) is None  # not sure
    assert serialized.read(deep).samples == _reads(deep) == 1  # the parser decides


def test_the_check_follows_the_installed_classes():
    rows, index = schema.message_rows(profiles_pb2.ProfilesData.DESCRIPTOR)
    sample = rows[index[profiles_pb2.Sample.DESCRIPTOR.full_name]]
    assert (1, schema.VARINT, 0, -1) in sample  # stack_index
    assert (4, schema.VARINT, 1, -1) in sample  # values, packed
    assert (5, schema.FIXED64, 1, -1) in sample  # timestamps_unix_nano
    strings = rows[index[profiles_pb2.ProfilesDictionary.DESCRIPTOR.full_name]]
    assert (5, schema.STRING, 1, -1) in strings


# -- a gateway end to end, with the C extension and without ----------------------------------------


@pytest.mark.parametrize("pure_python", [False, True], ids=["C extension", "pure Python"])
def test_a_gateway_batches_real_agent_reports_and_sends_every_sample_as_it_came(collectors, pure_python):
    """A real pycollector: otlp receiver (gRPC) -> batch -> otlp_grpc exporter, fed real agent
    reports and a v1.10 request of another shape, as the C extension runs it and as a pycollector
    installed without a compiler does (PYCOLLECTOR_PURE_PYTHON)."""
    port, metrics = free_port(), free_port()
    reports = [profiles_pb2.ProfilesData.FromString(report) for report in agent_reports.load()[:6]] + [a_profile(samples=4)]
    expected = [sample for report in reports for sample in sample_tuples(report)]
    with GrpcBackend() as sink:
        gateway = collectors(
            "gateway",
            {
                "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
                "processors": {"batch": {"send_batch_size": len(expected), "timeout": "10s"}},
                "exporters": {"otlp_grpc": {"endpoint": sink.endpoint, "tls": {"insecure": True}}},
                "service": {
                    "workers": 1,  # (one batch of every request, in order: several workers would each batch theirs)
                    "telemetry": {"metrics": {"address": f"127.0.0.1:{metrics}"}},
                    "pipelines": {"profiles": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["otlp_grpc"]}},
                },
            },
            env={"PYCOLLECTOR_PURE_PYTHON": "1"} if pure_python else None,
        )
        gateway.wait_listening(port)
        for report in reports:  # one at a time: the batch keeps their order
            assert export_grpc(f"127.0.0.1:{port}", report) == grpc.StatusCode.OK
        assert sink.wait_for(lambda s: len(s.messages) == 1, timeout=15), gateway.log()
        [batch] = sink.of("profiles")
        assert validate_indices(batch) == []
        assert sample_tuples(batch) == expected  # one request, every sample resolving as it did
        assert wait_for_series(metrics, 'otelcol_exporter_sent_profile_samples_total{exporter="otlp_grpc"}', len(expected)) == len(expected)
        code, _ = gateway.stop()
        assert code == 0, gateway.log()
