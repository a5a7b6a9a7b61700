"""The fuzz targets: what each one feeds the code under test, and what it checks.

A target is a function of one ``bytes`` input, what libFuzzer mutates and a corpus file holds. It
returns when the code under test gave a result or refused the input in its documented way, and
raises anything else: the unexpected exception itself, or an AssertionError when a property fails.
An input that takes longer than its target's ``timeout`` is a hang.

- ``otlp_decode``: an OTLP request as the otlp receiver decodes it, over HTTP (protobuf or JSON,
  identity, gzip, deflate or zstd, Content-Length or chunked) or gRPC, any signal, any
  ``profiles_wire_version``. Documented refusals: HTTP 400 or 413 (``BodyError`` from reading
  the body, ``ValueError`` from decoding it), gRPC INVALID_ARGUMENT. The refusal must encode as
  the server sends it, and what is accepted must count and encode as the pipeline will.
- ``config``: YAML files, ``--set`` flags, environment variables and files that ``${file:...}``
  reads, through ``load`` and ``build_plan`` (``pycollector validate``): a Plan, or a ConfigError
  each of whose problems starts with the place it is about.
- ``profiles_append_split``: two serialized ProfilesData, mutated, through the batch processor's
  ``Pending`` (check, append, cut): what it refuses is a ValueError, the batch unchanged; what
  ``add`` takes goes out in valid batches, every sample with its values and resolved stack, in
  order (see ``batch_and_cut`` for fields of the wrong wire type).
- ``profiles_merge_split``: the same property for valid ProfilesData a hypothesis strategy
  builds with ``ProfilesBuilder``, batched and cut as the processor does, and merged by
  re-interning (``ProfilesBuilder.merge``). libFuzzer drives it through ``fuzz_one_input``.
"""

from __future__ import annotations

import atexit
import dataclasses
import gzip
import io
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable
from email.message import Message as Headers
from pathlib import Path
from typing import Any

import grpc
import zstandard
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.config import ConfigError, load
from pycollector.config.validate import Plan, build_plan
from pycollector.otlp import ENCODINGS, OTLP_SIGNALS
from pycollector.pdata import ProfilesBuilder, item_count, iter_samples, sample_count, sample_type, validate_indices
from pycollector.pdata.attributes import from_any_value
from pycollector.pdata.zero_entries import with_zero_entries
from pycollector.pdata.serialized import SerializedProfiles
from pycollector.registry import Registry
from processors.batch.pending import Pending
from receivers.otlp.decoding import RequestDecoder
from receivers.otlp.delivery import Rejection, undecodable
from receivers.otlp.http_body import BodyError, read_body
from receivers.otlp.http_server import _code_for
from tests.fuzz import parser_targets

# -- otlp_decode ----------------------------------------------------------------------------------

SIGNALS = ("profiles", "traces", "metrics", "logs")
CONTENT_ENCODINGS = ("", "gzip", "zstd", "deflate")
LAYOUTS = ("auto", "1.8", "1.9", "1.10")
# max_request_body_size in the fuzzer: a parameter of the same code, small enough for a fast
# fuzzer (a zstd bomb decompresses up to it); the real receiver in the tests is given it too.
BODY_LIMIT = 1 << 20


@dataclasses.dataclass(frozen=True)
class OtlpCase:
    """One request, read from an input: two header bytes, then the payload.

    Byte 0: bits 0-1 the signal, bit 2 JSON (else protobuf), bits 3-4 the Content-Encoding, bit 5
    raw (the payload is the body as sent, its compression and chunks fuzzed too; else the harness
    compresses and frames it, so mutations reach the decoder), bit 6 chunked, bit 7 gRPC (the
    payload is the request message; encoding and framing bits do not apply). Byte 1: bits 0-1
    the receiver's profiles_wire_version, bits 2-7 the chunk size when the harness chunks.
    """

    signal: str
    json: bool
    content_encoding: str
    raw: bool
    chunked: bool
    grpc: bool
    layout: str
    chunk_size: int
    payload: bytes

    @classmethod
    def parse(cls, data: bytes) -> OtlpCase | None:
        if len(data) < 2:
            return None
        flags, extra = data[0], data[1]
        return cls(
            signal=SIGNALS[flags & 3],
            json=bool(flags & 4),
            content_encoding=CONTENT_ENCODINGS[flags >> 3 & 3],
            raw=bool(flags & 32),
            chunked=bool(flags & 64),
            grpc=bool(flags & 128),
            layout=LAYOUTS[extra & 3],
            chunk_size=1 + (extra >> 2) * 97,
            payload=data[2:],
        )

    def to_bytes(self) -> bytes:
        flags = (
            SIGNALS.index(self.signal)
            | self.json << 2
            | CONTENT_ENCODINGS.index(self.content_encoding) << 3
            | self.raw << 5
            | self.chunked << 6
            | self.grpc << 7
        )
        extra = LAYOUTS.index(self.layout) | ((self.chunk_size - 1) // 97) << 2
        return bytes([flags, extra]) + self.payload

    @property
    def encoding(self):
        return ENCODINGS["proto" if self.grpc or not self.json else "json"]

    def http_request(self) -> tuple[dict[str, str], bytes]:
        """The headers and the body bytes an HTTP client sends."""
        headers = {"Content-Type": self.encoding.content_type}
        if self.content_encoding:
            headers["Content-Encoding"] = self.content_encoding
        body = self.payload if self.raw else compress(self.payload, self.content_encoding)
        if self.chunked:
            headers["Transfer-Encoding"] = "chunked"
            if not self.raw:
                body = chunk(body, self.chunk_size)
        else:
            headers["Content-Length"] = str(len(body))
        return headers, body


def compress(body: bytes, content_encoding: str) -> bytes:
    if content_encoding == "gzip":
        return gzip.compress(body, mtime=0)
    if content_encoding == "deflate":
        return zlib.compress(body)
    if content_encoding == "zstd":
        return zstandard.ZstdCompressor().compress(body)
    return body


def chunk(body: bytes, size: int) -> bytes:
    pieces = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"".join(pieces) + b"0\r\n\r\n"


class _Quiet:
    """A logger that says nothing (the decoder logs layouts it meets once per process)."""

    def __getattr__(self, level: str) -> Callable[..., None]:
        return lambda *args, **fields: None


_DECODERS = {layout: RequestDecoder("otlp/fuzz", layout, _Quiet()) for layout in LAYOUTS}


def otlp_decode(data: bytes) -> int | None:
    case = OtlpCase.parse(data)
    return None if case is None else decode_case(case)


def decode_case(case: OtlpCase) -> int:
    """What the receiver answers: 200, or the HTTP status of its refusal (gRPC: 200 is OK, 400
    INVALID_ARGUMENT). Raises when the receiver's code does anything it does not document."""
    otlp, encoding, decoder = OTLP_SIGNALS[case.signal], case.encoding, _DECODERS[case.layout]
    if case.grpc:
        body = case.payload
    else:
        headers, wire = case.http_request()
        message = Headers()
        for name, value in headers.items():
            message[name] = value
        try:
            body = read_body(io.BytesIO(wire), message, BODY_LIMIT)
        except BodyError as error:
            assert error.status in (400, 413), f"read_body refused with HTTP {error.status}"
            return _refused(Rejection(_code_for(error.status), error.status, str(error)), case)
        assert len(body) <= BODY_LIMIT, f"read_body returned {len(body)} bytes, over its limit"
    try:
        data = decoder.decode(otlp, body, encoding)
    except ValueError as error:  # what both servers answer with 400 / INVALID_ARGUMENT
        return _refused(undecodable(otlp.signal, error), case)
    if isinstance(data, SerializedProfiles):  # accepted without the parser: it must agree
        message = data.to_message()
        assert isinstance(message, otlp.data_type) and sample_count(message) == data.samples
    else:
        assert isinstance(data, otlp.data_type), f"decoded a {type(data).__name__}"
    item_count(data)  # Delivery counts before it pushes
    data.SerializeToString()  # every exporter does
    encoding.encode(otlp.response_type())
    return 200


def _refused(rejection: Rejection, case: OtlpCase) -> int:
    if case.grpc:
        assert rejection.grpc_code == grpc.StatusCode.INVALID_ARGUMENT, rejection.grpc_code
        rejection.message.encode("utf-8")  # gRPC sends it as the status message
    else:
        case.encoding.encode(rejection.status())  # the body of the HTTP answer
    return rejection.http_status


# -- config -----------------------------------------------------------------------------------

# The config target's files, in a directory of this process's own; ``@DIR@`` in an input stands
# for it.
_CONFIG_DIR: list[Path] = []
_REGISTRY: list[Registry] = []


def config_dir() -> Path:
    if not _CONFIG_DIR:
        _CONFIG_DIR.append(Path(tempfile.mkdtemp(prefix="pycollector-fuzz-config-")))
        atexit.register(shutil.rmtree, _CONFIG_DIR[0], ignore_errors=True)
    return _CONFIG_DIR[0]


def config(data: bytes) -> Plan | ConfigError:
    """Parts split at NUL bytes: the config file, a second config file merged over it (when not
    empty), ``--set`` flags one a line, environment variables NAME=VALUE one a line, then the
    contents of files ``@DIR@/f0``, ``@DIR@/f1``... Flags and variables are decoded as Python
    decodes argv and the environment (invalid UTF-8 as surrogate escapes)."""
    directory = config_dir()
    parts = data.replace(b"@DIR@", os.fsencode(directory)).split(b"\0")
    parts += [b""] * (4 - len(parts))
    main, override, sets, variables, files = parts[0], parts[1], parts[2], parts[3], parts[4:]
    for old in directory.iterdir():
        old.unlink()
    paths = [directory / "config.yaml"]
    paths[0].write_bytes(main)
    if override:
        paths.append(directory / "override.yaml")
        paths[1].write_bytes(override)
    for index, content in enumerate(files):
        (directory / f"f{index}").write_bytes(content)
    env = {}
    for line in os.fsdecode(variables).split("\n"):
        name, equals, value = line.partition("=")
        if equals and name:
            env[name] = value
    flags = [line for line in os.fsdecode(sets).split("\n") if line]
    if not _REGISTRY:
        _REGISTRY.append(Registry())
    try:
        plan = build_plan(load([str(path) for path in paths], flags, env=env, warn=lambda message: None), _REGISTRY[0])
    except ConfigError as error:
        assert error.problems, "a ConfigError without problems"
        for problem in error.problems:
            place, colon, what = problem.partition(": ")
            assert colon and place.strip() and what.strip(), f"a problem that names no place: {problem!r}"
        return error
    assert isinstance(plan, Plan)
    return plan


# -- profiles: append and split -------------------------------------------------------------------


def profiles_append_split(data: bytes) -> list[tuple] | None:
    """Two bytes, big-endian: where the rest is cut into two messages. A part that does not
    parse as ProfilesData is one the receiver refuses before any batch sees it."""
    if len(data) < 2:
        return None
    cut = int.from_bytes(data[:2], "big")
    messages = []
    for part in (data[2 : 2 + cut], data[2 + cut :]):
        try:
            messages.append(profiles_pb2.ProfilesData.FromString(part))
        except DecodeError:
            continue
    return batch_and_cut(messages, send_batch_max_size=1 + data[0] % 4, refusals=True)


def batch_and_cut(messages: list[profiles_pb2.ProfilesData], send_batch_max_size: int, refusals: bool) -> list[tuple]:
    """What the batch processor does with ``messages``: add each, then send batches of at most
    ``send_batch_max_size`` off the front until none is left. Checks that every batch is valid
    and that every sample ``add`` took leaves in a batch, in order, with its values and resolved
    stack; returns them.

    Not the samples of a message with a field of the wrong wire type (or unknown to the installed
    classes) in its dictionary or samples: its class skips that field, while ``append`` reads
    the bytes with types of its own (``appending.shadow``) that take, for one, a length-delimited
    field where a varint was declared as a packed list of varints. No encoder writes such a
    message; it is taken and sent on valid, as ``append`` reads it."""
    before = [message.SerializeToString() for message in messages]
    pending, expected = Pending("profiles"), []
    for message in messages:
        held = _held(pending)
        try:
            pending.add(message)
        except ValueError:
            assert refusals, "add refused valid profiles"
            assert _held(pending) == held, "a refused add changed the batch"
            continue
        expected += samples(message) if _well_typed(message) else [None] * item_count(message)
    assert pending.count == len(expected), f"the batch counts {pending.count} samples, holds {len(expected)}"
    sent = []
    while pending.count:
        size = min(pending.count, send_batch_max_size)
        batch, rest = pending.cut(size)
        assert item_count(batch) == size, f"a cut of {size} gave {item_count(batch)}"
        assert validate_indices(batch) == [], validate_indices(batch)[:3]
        sent += samples(batch)
        pending.keep(rest, pending.count - size)
    assert len(sent) == len(expected), f"{len(expected)} samples added, {len(sent)} sent"
    compared = [(out, kept) for out, kept in zip(sent, expected) if kept is not None]
    assert all(out == kept for out, kept in compared), "the batches do not hold the samples added, in order"
    assert [message.SerializeToString() for message in messages] == before, "batching changed a message it was given"
    return sent


def _well_typed(message: profiles_pb2.ProfilesData) -> bool:
    copy = profiles_pb2.ProfilesData()
    copy.CopyFrom(message)
    copy.DiscardUnknownFields()
    return copy.ByteSize() == message.ByteSize()


def _held(pending: Pending) -> tuple[int, bytes | None]:
    return pending.count, None if pending.message is None else pending.message.SerializeToString()


def samples(data: profiles_pb2.ProfilesData) -> list[tuple]:
    """Each sample as a comparable tuple: where it is, its values, stack and attributes resolved."""
    dictionary = with_zero_entries(data.dictionary)
    out = []
    for view in iter_samples(data):
        profile, sample = view.profile, view.sample
        link = dictionary.link_table[sample.link_index]
        out.append(
            (
                _show(view.resource),
                view.scope_name,
                sample_type(data, profile),
                (profile.period, profile.time_unix_nano, profile.duration_nano, profile.profile_id),
                _show(_attributes(dictionary, profile.attribute_indices)),
                tuple(view.frames),
                _show(view.attributes),
                tuple(view.values),
                tuple(sample.timestamps_unix_nano),
                (link.trace_id, link.span_id),
            )
        )
    return out


def _attributes(dictionary: profiles_pb2.ProfilesDictionary, indices) -> dict[str, Any]:
    entries = (dictionary.attribute_table[index] for index in indices)
    return {dictionary.string_table[entry.key_strindex]: from_any_value(entry.value) for entry in entries}


def _show(values: dict[str, Any]) -> str:
    """repr, so that NaN equals NaN."""
    return repr(sorted(values.items()))


# -- profiles built by a strategy -------------------------------------------------------------

_names = st.text(alphabet="abcé_/.:🙂", max_size=6)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    _names,
    st.binary(max_size=4),
)
_attribute_maps = st.dictionaries(_names, st.one_of(_scalars, st.lists(_scalars, max_size=2)), max_size=3)


@st.composite
def profiles_data(draw) -> profiles_pb2.ProfilesData:
    builder = ProfilesBuilder()
    u64 = st.integers(0, 2**64 - 1)
    functions = [0] + [
        builder.function(draw(_names), draw(_names), draw(_names), draw(st.integers(0, 2**63 - 1)))
        for _ in range(draw(st.integers(0, 3)))
    ]
    mappings = [0] + [
        builder.mapping(draw(u64), draw(u64), draw(u64), draw(_names), draw(_attribute_maps))
        for _ in range(draw(st.integers(0, 2)))
    ]
    lines = st.tuples(st.sampled_from(functions), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
    locations = [0] + [
        builder.location(draw(st.sampled_from(mappings)), draw(u64), draw(st.lists(lines, max_size=2)), draw(_attribute_maps))
        for _ in range(draw(st.integers(0, 5)))
    ]
    stacks = [0] + [builder.stack(draw(st.lists(st.sampled_from(locations), max_size=5))) for _ in range(draw(st.integers(0, 4)))]
    links = [0] + [builder.link(draw(st.binary(min_size=16, max_size=16)), draw(st.binary(min_size=8, max_size=8))) for _ in range(draw(st.integers(0, 2)))]
    for _ in range(draw(st.integers(0, 2))):
        resource = builder.resource_profiles(draw(_attribute_maps), schema_url=draw(_names))
        for _ in range(draw(st.integers(0, 2))):
            scope = builder.scope_profiles(resource, name=draw(_names), version=draw(_names))
            for _ in range(draw(st.integers(0, 2))):
                profile = builder.profile(
                    scope,
                    sample_type=(draw(_names), draw(_names)),
                    period_type=(draw(_names), draw(_names)),
                    period=draw(st.integers(0, 2**63 - 1)),
                    time_unix_nano=draw(u64),
                    attributes=draw(_attribute_maps),
                    profile_id=draw(st.binary(min_size=16, max_size=16)),
                )
                for _ in range(draw(st.integers(0, 4))):
                    builder.sample(
                        profile,
                        draw(st.sampled_from(stacks)),
                        draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=2)),
                        attributes=draw(_attribute_maps),
                        timestamps_unix_nano=draw(st.lists(u64, max_size=2)),
                        link_index=draw(st.sampled_from(links)),
                    )
    return builder.data


@settings(
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(messages=st.lists(profiles_data(), min_size=1, max_size=4), send_batch_max_size=st.integers(1, 6))
def profiles_merge_split(messages: list[profiles_pb2.ProfilesData], send_batch_max_size: int) -> None:
    expected = [sample for message in messages for sample in samples(message)]
    assert batch_and_cut(messages, send_batch_max_size, refusals=False) == expected
    builder = ProfilesBuilder()
    for message in messages:
        builder.merge(message)
    assert validate_indices(builder.data) == []
    assert samples(builder.data) == expected, "merging (re-interning) lost or changed samples"


# -- the set ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], Any]
    max_len: int  # the largest input libFuzzer makes
    timeout: int  # seconds one input may take before libFuzzer calls it a hang


TARGETS = {
    target.name: target
    for target in (
        Target("otlp_decode", otlp_decode, max_len=16384, timeout=10),
        Target("config", config, max_len=8192, timeout=10),
        Target("profiles_append_split", profiles_append_split, max_len=8192, timeout=10),
        Target("profiles_merge_split", profiles_merge_split.hypothesis.fuzz_one_input, max_len=8192, timeout=10),
        # The profiling receiver's parsers (parser_targets.py): bytes a sampled process chose.
        Target("elf_file", parser_targets.elf_file, max_len=65536, timeout=10),
        Target("eh_frame", parser_targets.eh_frame, max_len=16384, timeout=10),
        Target("gopclntab", parser_targets.gopclntab, max_len=65536, timeout=10),
        Target("perf_map", parser_targets.perf_map, max_len=8192, timeout=10),
        Target("cpython_linetable", parser_targets.cpython_linetable, max_len=4096, timeout=10),
        Target("cpython_debug_offsets", parser_targets.cpython_debug_offsets, max_len=4096, timeout=10),
    )
}
