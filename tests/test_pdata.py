"""pycollector.pdata: interning, merging, counting and resolving OTLP messages."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from pycollector.pdata import (
    ITEM_NAMES,
    Frame,
    ProfilesBuilder,
    frames_of,
    from_any_value,
    item_count,
    iter_samples,
    key_values,
    merge,
    sample_count,
    sample_type,
    signal_of,
    to_any_value,
    to_dict,
    validate_indices,
)
from pycollector.pdata import appending
from pycollector.pdata.appending.moves import Move
from pycollector.pdata.appending.tables import moved_stacks
from pycollector.pdata.zero_entries import TABLES, with_zero_entries

FRAME_TYPE = "profile.frame.type"
BUILD_ID = "process.executable.build_id.gnu"

# -- random profiles as plain Python descriptions -------------------------------------------------
# Small alphabets on purpose: separately built inputs then share strings, functions, locations and
# stacks, which is what merging has to deduplicate.

_names = st.sampled_from(["", "main", "run", "épée", "__libc_start_main", "do_syscall_64"])
_files = st.sampled_from(["", "app.py", "lib.c", "/usr/lib/libc.so.6"])
_int64 = st.integers(-(2**63), 2**63 - 1)
_attribute_value = st.one_of(
    st.text(max_size=5),
    _int64,
    st.booleans(),
    st.floats(allow_nan=False),
    st.lists(st.sampled_from(["a", "b"]), max_size=3),
)

_line = st.fixed_dictionaries(
    {
        "function": _names,
        "filename": _files,
        "line": st.integers(0, 300),
        "column": st.integers(0, 3),
    }
)
_location = st.fixed_dictionaries(
    {
        "address": st.sampled_from([0, 0x1000, 0x7F00_0000_1234, 2**64 - 1]),
        "frame_type": st.sampled_from(["", "native", "python", "kernel"]),
        "mapping_file": _files,
        "build_id": st.sampled_from(["", "deadbeef", "c0ffee"]),
        # Several lines = inlined functions at one address.
        "lines": st.lists(_line, min_size=1, max_size=3),
    }
)
_sample = st.fixed_dictionaries(
    {
        "locations": st.lists(_location, max_size=5),
        "attributes": st.fixed_dictionaries(
            {},
            optional={
                "thread.id": st.integers(1, 4),
                "thread.name": st.sampled_from(["main", "worker", ""]),
            },
        ),
        "values": st.lists(_int64, min_size=1, max_size=2),
        "timestamps": st.lists(st.integers(0, 2**64 - 1), max_size=3),
    }
)
_profile = st.fixed_dictionaries(
    {
        "sample_type": st.sampled_from([("samples", "count"), ("cpu", "nanoseconds")]),
        "attributes": st.dictionaries(
            st.sampled_from(["profile.x", "profile.y"]), _attribute_value, max_size=2
        ),
        "samples": st.lists(_sample, max_size=5),
    }
)
_resource = st.fixed_dictionaries(
    {
        "attributes": st.dictionaries(
            st.sampled_from(["service.name", "host.name", "process.pid"]),
            _attribute_value,
            max_size=3,
        ),
        "scope": st.sampled_from(["", "ebpf-profiler"]),
        "profiles": st.lists(_profile, max_size=3),
    }
)
_inputs = st.lists(st.lists(_resource, max_size=3), min_size=1, max_size=4)


def _location_index(builder: ProfilesBuilder, location: dict) -> int:
    mapping = builder.mapping(
        filename=location["mapping_file"],
        attributes={BUILD_ID: location["build_id"]} if location["build_id"] else None,
    )
    lines = [
        (
            builder.function(line["function"], filename=line["filename"]),
            line["line"],
            line["column"],
        )
        for line in location["lines"]
    ]
    attributes = {FRAME_TYPE: location["frame_type"]} if location["frame_type"] else None
    return builder.location(mapping, location["address"], lines, attributes)


def _build(resources: list[dict]) -> profiles_pb2.ProfilesData:
    builder = ProfilesBuilder()
    for resource in resources:
        scope = builder.scope_profiles(
            builder.resource_profiles(resource["attributes"]), resource["scope"]
        )
        for profile_desc in resource["profiles"]:
            profile = builder.profile(
                scope,
                sample_type=profile_desc["sample_type"],
                attributes=profile_desc["attributes"],
            )
            for sample in profile_desc["samples"]:
                stack = builder.stack(
                    [_location_index(builder, loc) for loc in sample["locations"]]
                )
                builder.sample(
                    profile, stack, sample["values"], sample["attributes"], sample["timestamps"]
                )
    return builder.data


def _expected_samples(resources: list[dict]) -> list[tuple]:
    return [
        (
            resource["attributes"],
            resource["scope"],
            profile["sample_type"],
            profile["attributes"],
            [
                Frame(
                    function=line["function"],
                    system_name="",
                    filename=line["filename"],
                    line=line["line"],
                    column=line["column"],
                    address=location["address"],
                    frame_type=location["frame_type"],
                    mapping_filename=location["mapping_file"],
                    build_id=location["build_id"],
                )
                for location in sample["locations"]
                for line in location["lines"]
            ],
            sample["attributes"],
            sample["values"],
            sample["timestamps"],
        )
        for resource in resources
        for profile in resource["profiles"]
        for sample in profile["samples"]
    ]


def _profile_attributes(data: profiles_pb2.ProfilesData, profile: profiles_pb2.Profile) -> dict:
    dictionary = data.dictionary
    entries = [dictionary.attribute_table[i] for i in profile.attribute_indices]
    return {dictionary.string_table[e.key_strindex]: from_any_value(e.value) for e in entries}


def _actual_samples(data: profiles_pb2.ProfilesData) -> list[tuple]:
    return [
        (
            view.resource,
            view.scope_name,
            sample_type(data, view.profile),
            _profile_attributes(data, view.profile),
            view.frames,
            view.attributes,
            view.values,
            list(view.sample.timestamps_unix_nano),
        )
        for view in iter_samples(data)
    ]


def _profile_ids(data: profiles_pb2.ProfilesData) -> list[bytes]:
    return [
        p.profile_id
        for rp in data.resource_profiles
        for sp in rp.scope_profiles
        for p in sp.profiles
    ]


def _entry_keys(data: profiles_pb2.ProfilesData) -> dict[str, list]:
    d = data.dictionary
    return {
        "strings": list(d.string_table),
        "attributes": [
            (a.key_strindex, a.value.SerializeToString(deterministic=True), a.unit_strindex)
            for a in d.attribute_table
        ],
        "functions": [
            (f.name_strindex, f.system_name_strindex, f.filename_strindex, f.start_line)
            for f in d.function_table
        ],
        "mappings": [
            (m.filename_strindex, tuple(sorted(m.attribute_indices))) for m in d.mapping_table
        ],
        "locations": [
            (
                loc.mapping_index,
                loc.address,
                tuple((ln.function_index, ln.line, ln.column) for ln in loc.lines),
                tuple(sorted(loc.attribute_indices)),
            )
            for loc in d.location_table
        ],
        "stacks": [tuple(s.location_indices) for s in d.stack_table],
        "links": [(link.trace_id, link.span_id) for link in d.link_table],
    }


def _table_sizes(data: profiles_pb2.ProfilesData) -> dict[str, int]:
    return {name: len(keys) for name, keys in _entry_keys(data).items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_inputs)
def test_merged_inputs_resolve_to_the_same_samples_with_a_deduplicated_dictionary(inputs):
    parts = [_build(resources) for resources in inputs]
    for part in parts:
        assert validate_indices(part) == []

    merged = ProfilesBuilder()
    for part in parts:
        merged.merge(part)
    data = merged.data

    expected = [s for resources in inputs for s in _expected_samples(resources)]
    assert _actual_samples(data) == expected
    assert sample_count(data) == len(expected)
    assert _profile_ids(data) == [pid for part in parts for pid in _profile_ids(part)]
    assert validate_indices(data) == []
    for name, keys in _entry_keys(data).items():
        assert len(keys) == len(set(keys)), f"duplicate entries in {name}"

    # Everything in parts[0] is already interned: merging it again adds samples, not entries.
    sizes = _table_sizes(data)
    merged.merge(parts[0])
    assert _table_sizes(data) == sizes


# -- targeted tests -------------------------------------------------------------------------


def test_every_table_starts_with_its_zero_entry_and_all_defaults_intern_to_it():
    builder = ProfilesBuilder()
    d = builder.data.dictionary
    assert d.string_table[:] == [""]
    for table in (
        d.mapping_table,
        d.location_table,
        d.function_table,
        d.link_table,
        d.attribute_table,
        d.stack_table,
    ):
        assert len(table) == 1 and table[0].ByteSize() == 0
    assert builder.string("") == 0
    assert builder.function("") == 0
    assert builder.mapping() == 0
    assert builder.location() == 0
    assert builder.stack([]) == 0
    assert builder.link(b"", b"") == 0


def test_interning_returns_equal_indices_for_equal_inputs():
    b = ProfilesBuilder()
    assert b.string("main") == b.string("main") != b.string("other")
    assert b.attribute("thread.id", 1) == b.attribute("thread.id", 1)
    assert b.attribute("k", 1) != b.attribute("k", True) != b.attribute("k", 1.0)
    assert b.attribute("k", 1) != b.attribute("k", 1, unit="ms")
    assert b.attribute("k", {"a": [1, 2]}) == b.attribute("k", {"a": [1, 2]})
    assert (
        b.function("f", "_Z1fv", "f.c", 3)
        == b.function("f", "_Z1fv", "f.c", 3)
        != b.function("f", filename="f.c")
    )
    m1 = b.mapping(0x1000, 0x2000, 0, "/bin/a", {"x": 1, BUILD_ID: "ab"})
    assert m1 == b.mapping(
        0x1000, 0x2000, 0, "/bin/a", {BUILD_ID: "ab", "x": 1}
    )  # attribute order ignored
    fn = b.function("f")
    loc = b.location(m1, 0x1234, [(fn, 7, 0)], {FRAME_TYPE: "native"})
    assert loc == b.location(m1, 0x1234, [(fn, 7, 0)], {FRAME_TYPE: "native"})
    assert loc != b.location(m1, 0x1234, [(fn, 8, 0)], {FRAME_TYPE: "native"})
    assert b.stack([loc, 0]) == b.stack((loc, 0)) != b.stack([0, loc])
    assert b.link(b"t" * 16, b"s" * 8) == b.link(b"t" * 16, b"s" * 8)
    assert len(set(b.data.dictionary.string_table)) == len(b.data.dictionary.string_table)


def test_wrapping_existing_data_rebuilds_the_intern_maps():
    first = ProfilesBuilder()
    indices = (
        first.string("main"),
        first.function("main", filename="a.py"),
        first.attribute("k", "v"),
    )
    again = ProfilesBuilder(first.data)
    assert (
        again.string("main"),
        again.function("main", filename="a.py"),
        again.attribute("k", "v"),
    ) == indices


def _one_sample_data(function: str, thread: str) -> profiles_pb2.ProfilesData:
    b = ProfilesBuilder()
    shared = b.location(
        b.mapping(filename="/bin/app"), 0x10, [(b.function("main", filename="app.c"), 1, 0)]
    )
    own = b.location(
        b.mapping(filename="/bin/app"), 0x20, [(b.function(function, filename="app.c"), 2, 0)]
    )
    profile = b.profile(b.scope_profiles(b.resource_profiles({"service.name": "app"})))
    b.sample(profile, b.stack([own, shared]), [1], {"thread.name": thread})
    return b.data


def test_merge_into_prebuilt_builder_dedupes_against_existing_entries():
    dst = _one_sample_data("work", "main")
    builder = ProfilesBuilder(dst)
    before = _table_sizes(dst)

    builder.merge(_one_sample_data("work", "main"))  # nothing new
    assert _table_sizes(dst) == before

    builder.merge(_one_sample_data("idle", "main"))  # one new string, function, location, stack
    after = _table_sizes(dst)
    grown = {name: after[name] - before[name] for name in after if after[name] != before[name]}
    assert grown == {"strings": 1, "functions": 1, "locations": 1, "stacks": 1}

    assert [[f.function for f in view.frames] for view in iter_samples(dst)] == [
        ["work", "main"],
        ["work", "main"],
        ["idle", "main"],
    ]
    assert validate_indices(dst) == []


def test_module_merge_returns_dst_and_accepts_src_without_dictionary():
    dst = _one_sample_data("work", "main")
    src = profiles_pb2.ProfilesData()
    src.resource_profiles.add().scope_profiles.add().profiles.add().samples.add(values=[5])
    assert merge(dst, src) is dst
    views = list(iter_samples(dst))
    assert [v.values for v in views] == [[1], [5]]
    assert views[1].frames == [] and views[1].attributes == {}
    assert sample_type(dst, views[1].profile) == ("", "")


def test_merging_data_into_itself_duplicates_its_samples_once():
    builder = ProfilesBuilder(_one_sample_data("work", "main"))
    sizes = _table_sizes(builder.data)
    builder.merge(builder.data)
    assert sample_count(builder.data) == 2
    assert _table_sizes(builder.data) == sizes


def test_merge_rejects_indices_outside_the_source_dictionary_and_appends_nothing():
    dst = _one_sample_data("work", "main")
    bad = _one_sample_data("x", "y")
    bad.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 99
    with pytest.raises(ValueError, match="validate_indices"):
        merge(dst, bad)
    assert sample_count(dst) == 1

    bad.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = -1
    with pytest.raises(ValueError):
        merge(dst, bad)
    assert sample_count(dst) == 1


def test_validate_indices_reports_out_of_range_indices():
    data = _one_sample_data("work", "main")
    assert validate_indices(data) == []
    sample = data.resource_profiles[0].scope_profiles[0].profiles[0].samples[0]
    sample.stack_index = len(data.dictionary.stack_table)
    sample.attribute_indices.append(-1)
    data.dictionary.function_table.add(name_strindex=1000)
    problems = validate_indices(data)
    assert len(problems) == 3
    assert any("samples[0].stack_index" in p and "stack_table" in p for p in problems)
    assert any("samples[0].attribute_indices[1] = -1" in p for p in problems)
    assert any("name_strindex = 1000" in p for p in problems)


def test_frames_leaf_first_with_inlined_lines_and_unsymbolized_locations():
    b = ProfilesBuilder()
    mapping = b.mapping(0x1000, 0x9000, 0, "/lib/libx.so", {BUILD_ID: "abcd"})
    inner, outer = b.function("inner", "_inner", "x.c", 1), b.function("outer", filename="x.c")
    inlined = b.location(mapping, 0x1100, [(inner, 10, 2), (outer, 20, 4)], {FRAME_TYPE: "native"})
    bare = b.location(mapping, 0x1200)
    stack = b.stack([inlined, bare])
    common = {"mapping_filename": "/lib/libx.so", "build_id": "abcd"}
    assert frames_of(b.data, stack) == [
        Frame("inner", "_inner", "x.c", 10, 2, 0x1100, "native", **common),
        Frame("outer", "", "x.c", 20, 4, 0x1100, "native", **common),
        Frame("", "", "", 0, 0, 0x1200, "", **common),
    ]


def test_profile_and_sample_fields():
    b = ProfilesBuilder()
    scope = b.scope_profiles(
        b.resource_profiles({"service.name": "s"}, schema_url="u"), "scope", "1.0"
    )
    p1 = b.profile(
        scope, period=10_000_000, time_unix_nano=5, duration_nano=7, attributes={"a": "b"}
    )
    p2 = b.profile(scope, sample_type=("cpu", "nanoseconds"), profile_id=b"\x01" * 16)
    assert len(p1.profile_id) == 16 and p1.profile_id != p2.profile_id == b"\x01" * 16
    assert sample_type(b.data, p1) == ("samples", "count") and sample_type(b.data, p2) == (
        "cpu",
        "nanoseconds",
    )
    strings = b.data.dictionary.string_table
    assert (strings[p1.period_type.type_strindex], strings[p1.period_type.unit_strindex]) == (
        "cpu",
        "nanoseconds",
    )
    link = b.link(b"t" * 16, b"s" * 8)
    sample = b.sample(
        p1, 0, [3, 4], {"thread.id": 9}, timestamps_unix_nano=[1, 2], link_index=link
    )
    assert (list(sample.values), list(sample.timestamps_unix_nano), sample.link_index) == (
        [3, 4],
        [1, 2],
        link,
    )
    (view,) = iter_samples(b.data)
    assert (view.resource, view.scope_name, view.attributes) == (
        {"service.name": "s"},
        "scope",
        {"thread.id": 9},
    )
    assert b.data.resource_profiles[0].schema_url == "u" and scope.scope.version == "1.0"
    assert validate_indices(b.data) == []


_any = st.recursive(
    st.none()
    | st.text(max_size=4)
    | _int64
    | st.booleans()
    | st.floats(allow_nan=False)
    | st.binary(max_size=4),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None)
@given(_any)
def test_any_value_round_trip(value):
    assert from_any_value(to_any_value(value)) == value
    assert to_dict(key_values({"k": value})) == {"k": value}


def test_any_value_conversions():
    assert to_any_value(True).WhichOneof("value") == "bool_value"
    assert to_any_value((1, "a")).array_value.values[1].string_value == "a"
    assert from_any_value(to_any_value(bytearray(b"x"))) == b"x"
    with pytest.raises(TypeError):
        to_any_value(object())


def _traces(request: bool = False):
    message = trace_service_pb2.ExportTraceServiceRequest() if request else trace_pb2.TracesData()
    scope = message.resource_spans.add().scope_spans.add()
    scope.spans.add()
    scope.spans.add()
    message.resource_spans.add().scope_spans.add().spans.add()
    return message


def _metrics(request: bool = False):
    message = (
        metrics_service_pb2.ExportMetricsServiceRequest() if request else metrics_pb2.MetricsData()
    )
    metrics = message.resource_metrics.add().scope_metrics.add().metrics
    metrics.add().gauge.data_points.add()
    metrics.add().sum.data_points.extend([metrics_pb2.NumberDataPoint()] * 2)
    metrics.add().histogram.data_points.add()
    metrics.add().exponential_histogram.data_points.add()
    metrics.add().summary.data_points.add()
    metrics.add(name="no data")
    return message


def _logs(request: bool = False):
    message = logs_service_pb2.ExportLogsServiceRequest() if request else logs_pb2.LogsData()
    message.resource_logs.add().scope_logs.add().log_records.extend([logs_pb2.LogRecord()] * 4)
    return message


def _profiles(request: bool = False):
    data = _one_sample_data("work", "main")
    if not request:
        return data
    message = profiles_service_pb2.ExportProfilesServiceRequest()
    message.ParseFromString(data.SerializeToString())  # same fields, same numbers
    return message


@pytest.mark.parametrize("request_type", [False, True], ids=["data", "export_request"])
@pytest.mark.parametrize(
    ("make", "signal", "count"),
    [
        (_profiles, "profiles", 1),
        (_traces, "traces", 3),
        (_metrics, "metrics", 6),
        (_logs, "logs", 4),
    ],
)
def test_signal_of_and_item_count(make, signal, count, request_type):
    message = make(request_type)
    assert signal_of(message) == signal
    assert item_count(message) == count
    assert signal in ITEM_NAMES


def test_signal_of_rejects_other_messages():
    with pytest.raises(TypeError):
        signal_of(common_pb2.KeyValue())
    with pytest.raises(TypeError):
        item_count(profiles_pb2.Profile())


def test_item_names():
    assert ITEM_NAMES == {
        "profiles": "profile_samples",
        "traces": "spans",
        "metrics": "metric_points",
        "logs": "log_records",
    }


def test_a_message_without_a_dictionary_reads_index_0_as_none():
    """Index 0 is "none" even when a sender left the tables out."""
    data = profiles_pb2.ProfilesData()
    profile = data.resource_profiles.add().scope_profiles.add().profiles.add()
    profile.samples.add(values=[7])
    assert validate_indices(data) == []
    [view] = iter_samples(data)
    assert (view.frames, view.values, view.attributes) == ([], [7], {})


# -- append: the batch processor's merge, tables concatenated and indices shifted ------------------


def _with_links(data: profiles_pb2.ProfilesData, seed: int) -> profiles_pb2.ProfilesData:
    """Links on some samples (the generated inputs have none)."""
    builder = ProfilesBuilder(data)
    samples = [s for rp in data.resource_profiles for sp in rp.scope_profiles for p in sp.profiles for s in p.samples]
    for number, sample in enumerate(samples):
        if (number + seed) % 3:
            sample.link_index = builder.link(bytes([number % 4 + 1]) * 16, bytes([seed % 7 + 1]) * 8)
    return data


def _leave_out(data: profiles_pb2.ProfilesData, tables: list[str]) -> profiles_pb2.ProfilesData:
    """Drop those of ``tables`` that hold only their zero entry, as a sender may."""
    for name in tables:
        table = getattr(data.dictionary, name)
        if len(table) == 1:
            del table[:]
    return data


def _completed(data: profiles_pb2.ProfilesData) -> profiles_pb2.ProfilesData:
    """A copy with every table's zero entry, to read samples from (sample_type wants strings)."""
    copy = profiles_pb2.ProfilesData()
    copy.CopyFrom(data)
    copy.dictionary.CopyFrom(with_zero_entries(data.dictionary))
    return copy


def _serialized_samples(data: profiles_pb2.ProfilesData) -> list[tuple]:
    """Each sample resolved, with its link and the fields append copies as they are."""
    links = with_zero_entries(data.dictionary).link_table
    return [
        (*resolved, (links[view.sample.link_index].trace_id, links[view.sample.link_index].span_id), view.profile.profile_id)
        for resolved, view in zip(_actual_samples(_completed(data)), iter_samples(data), strict=True)
    ]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inputs=_inputs,
    left_out=st.lists(st.sampled_from(TABLES), unique=True),
    into_empty=st.booleans(),
)
def test_appended_messages_resolve_to_the_same_samples_and_every_index_is_valid(inputs, left_out, into_empty):
    parts = [_leave_out(_with_links(_build(resources), seed), left_out) for seed, resources in enumerate(inputs)]
    dst = profiles_pb2.ProfilesData() if into_empty else _leave_out(_with_links(_build([]), 0), left_out)
    for part in parts:
        before = part.SerializeToString()
        appending.check(part)
        appending.append(dst, part)
        assert part.SerializeToString() == before  # only read
    assert validate_indices(dst) == []
    assert _serialized_samples(dst) == [s for part in parts for s in _serialized_samples(part)]
    # Nothing is looked up: each part's entries are all there, less its zero entries.
    for name in TABLES:
        assert len(getattr(dst.dictionary, name)) == 1 + sum(max(len(getattr(p.dictionary, name)) - 1, 0) for p in parts)


def test_append_keeps_a_first_entry_that_is_not_the_zero_value():
    """A sender breaking the "index 0 is the zero value" rule still means what it says."""
    src = _one_sample_data("work", "main")
    src.dictionary.string_table[0] = "zero"
    src.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].link_index = 0
    src.dictionary.link_table[0].trace_id = b"t" * 16
    dst = _one_sample_data("idle", "main")
    appending.append(dst, src)
    assert validate_indices(dst) == []
    [_, view] = iter_samples(dst)
    assert view.attributes == {"thread.name": "main"}
    assert dst.dictionary.string_table[len(dst.dictionary.string_table) - len(src.dictionary.string_table)] == "zero"
    assert [f.function for f in view.frames] == ["work", "main"]
    sample = view.sample
    assert dst.dictionary.link_table[sample.link_index].trace_id == b"t" * 16


def test_append_accepts_an_export_request_and_a_source_without_dictionary():
    dst = _one_sample_data("work", "main")
    request = profiles_service_pb2.ExportProfilesServiceRequest()
    request.ParseFromString(_one_sample_data("idle", "main").SerializeToString())
    appending.append(dst, request)
    bare = profiles_pb2.ProfilesData()
    bare.resource_profiles.add().scope_profiles.add().profiles.add().samples.add(values=[5])
    appending.append(dst, bare)
    assert validate_indices(dst) == []
    assert [[f.function for f in v.frames] for v in iter_samples(dst)] == [["work", "main"], ["idle", "main"], []]


def test_stacks_keep_location_0_and_move_by_any_offset():
    """Stack indices move as lanes of one integer: every width of varint, and 0 staying 0."""
    stacks = [[], [0, 1], [2, 0, 1, 2], [1] * 200]
    entries = [profiles_pb2.Stack(location_indices=s).SerializeToString() for s in stacks]
    for by in (0, 5, 127, 200, 16_000, 1 << 21, 1 << 28, 1 << 30):
        for keep_zero in (False, True):
            move = Move("location_table", 3, by, drop_zero=not keep_zero)
            moved = [profiles_pb2.Stack.FromString(e).location_indices[:] for e in moved_stacks(entries, move)]
            assert moved == [[move(i) for i in s] for s in stacks]


def _with_bad_index(field: str) -> profiles_pb2.ProfilesData:
    data = _one_sample_data("work", "main")
    d = data.dictionary
    profile = data.resource_profiles[0].scope_profiles[0].profiles[0]
    sample = profile.samples[0]
    if field == "stack_index":
        sample.stack_index = len(d.stack_table)
    elif field == "link_index":
        sample.link_index = 7
    elif field == "samples[0].attribute_indices":
        sample.attribute_indices.append(-1)
    elif field == "profiles[0].attribute_indices":
        profile.attribute_indices.append(len(d.attribute_table))
    elif field == "sample_type.unit_strindex":
        profile.sample_type.unit_strindex = -3
    elif field == "location_indices":
        d.stack_table[1].location_indices.append(len(d.location_table))
    elif field == "function_index":
        d.location_table[1].lines[0].function_index = 1000
    elif field == "mapping_index":
        d.location_table[1].mapping_index = -1
    elif field == "location_table[1].attribute_indices":
        d.location_table[1].attribute_indices.append(99)
    elif field == "name_strindex":
        d.function_table[1].name_strindex = len(d.string_table)
    elif field == "filename_strindex":
        d.mapping_table[1].filename_strindex = 12345678
    elif field == "key_strindex":
        d.attribute_table[1].key_strindex = -2
    return data


@pytest.mark.parametrize(
    "field",
    [
        "stack_index",
        "link_index",
        "samples[0].attribute_indices",
        "profiles[0].attribute_indices",
        "sample_type.unit_strindex",
        "location_indices",
        "function_index",
        "mapping_index",
        "location_table[1].attribute_indices",
        "name_strindex",
        "filename_strindex",
        "key_strindex",
    ],
)
def test_append_and_check_name_an_index_outside_its_table_and_leave_dst_as_it_was(field):
    bad = _with_bad_index(field)
    assert validate_indices(bad)
    dst = _one_sample_data("idle", "main")
    before = dst.SerializeToString()
    with pytest.raises(ValueError, match=f"outside their dictionary: .*{field.split('.')[-1]}"):
        appending.append(dst, bad)
    assert dst.SerializeToString() == before
    with pytest.raises(ValueError, match="outside their dictionary"):
        appending.check(bad)
    appending.check(dst)
