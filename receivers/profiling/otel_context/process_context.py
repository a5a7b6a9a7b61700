"""The process context an OpenTelemetry SDK publishes (OTEP 4719): its resource, for readers
outside the process.

The SDK maps a small region named OTEL_CTX (the process table finds it in /proc/PID/maps:
``ProcessInfo.context_address``) and writes there a header (the layout below, native byte order) pointing at its resource,
encoded as an ``opentelemetry.proto.resource.v1.Resource``. Writers fill the header and write the
signature last; an update zeroes ``published_at_ns``, changes the payload, then sets a new time.
So a reader reads the header, the payload, and the time again: the same time means a whole read.

Everything here comes from the sampled process: the payload's size is capped, its attributes
are counted, cut and checked (only what a resource may hold), and a process that never holds
still is given up after a few tries (counted), its profile keeping what the agent measured.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError
from opentelemetry.proto.resource.v1 import resource_pb2

from ..processes.memory import ProcessMemory

SIGNATURE = b"OTEL_CTX"
VERSIONS = (1, 2)  # 2 is the OTEP's; 1 is the one it leaves to development
# signature, version, payload_size, published_at_ns, payload (a pointer)
HEADER = struct.Struct("=8sIIQQ")
_PUBLISHED_AT = struct.Struct("=Q")
_PUBLISHED_AT_OFFSET = 16

MAX_PAYLOAD_BYTES = 64 << 10  # a resource of a few dozen attributes takes a few hundred bytes
MAX_ATTRIBUTES = 128
MAX_KEY_CHARS = 256
MAX_VALUE_CHARS = 1024
MAX_KEY_MAP_ENTRIES = 256  # the thread context's key index is one byte
TRUNCATED = "…[truncated]"
READ_TRIES = 3

# Keys of the thread context's reference data: coordination between the SDK and readers, not
# attributes of the resource (OTEP 4947 keeps them out of exports).
SCHEMA_VERSION_KEY = "threadlocal.schema_version"
KEY_MAP_KEY = "threadlocal.attribute_key_map"


class ContextError(ValueError):
    """The region is not a process context we read, or it could not be read whole."""


@dataclass(frozen=True)
class ProcessContext:
    published_at_ns: int
    attributes: dict[str, str | int | float | bool] = field(default_factory=dict)  # the resource's
    schema_version: str | None = None  # threadlocal.schema_version, when the SDK shares thread contexts
    key_map: tuple[str, ...] = ()  # threadlocal.attribute_key_map: a thread record's key index -> name
    dropped: int = 0  # attributes left out: past MAX_ATTRIBUTES, or of a kind a resource here does not carry


def published_at(memory: ProcessMemory, address: int) -> int:
    """The region's publication time (0 while an update is under way): whether to read it again."""
    return _PUBLISHED_AT.unpack(memory.read(address + _PUBLISHED_AT_OFFSET, _PUBLISHED_AT.size))[0]


def read_process_context(memory: ProcessMemory, address: int) -> ProcessContext:
    """The process context at ``address`` (the region's start). Raises ContextError when it is
    not one (signature, version), is too large, changed under each of READ_TRIES reads, or its
    payload is no Resource; MemoryReadError when the memory cannot be read."""
    for _ in range(READ_TRIES):
        signature, version, size, published, payload_at = HEADER.unpack(memory.read(address, HEADER.size))
        if signature != SIGNATURE or version not in VERSIONS:
            raise ContextError(f"no process context at 0x{address:x} (signature {signature!r}, version {version})")
        if size > MAX_PAYLOAD_BYTES:
            raise ContextError(f"a process context of {size} bytes, over {MAX_PAYLOAD_BYTES}")
        if published == 0:  # an update under way
            continue
        payload = memory.read(payload_at, size) if size else b""
        if published_at(memory, address) == published:
            return _decode(payload, published)
    raise ContextError(f"the process context changed under each of {READ_TRIES} reads")


def _decode(payload: bytes, published: int) -> ProcessContext:
    resource = resource_pb2.Resource()
    try:
        resource.ParseFromString(payload)
    except DecodeError as error:
        raise ContextError(f"the process context's payload is not a Resource: {error}") from None
    attributes: dict[str, str | int | float | bool] = {}
    schema_version, key_map, dropped = None, (), 0
    for pair in resource.attributes:
        key = pair.key
        if key == SCHEMA_VERSION_KEY:
            schema_version = _cut(pair.value.string_value, MAX_KEY_CHARS)
        elif key == KEY_MAP_KEY:
            key_map = tuple(_cut(value.string_value, MAX_KEY_CHARS) for value in pair.value.array_value.values[:MAX_KEY_MAP_ENTRIES])
        elif len(attributes) >= MAX_ATTRIBUTES or not key or len(key) > MAX_KEY_CHARS:
            dropped += 1
        else:
            value = _scalar(pair.value)
            if value is None:
                dropped += 1
            else:
                attributes[key] = value
    return ProcessContext(published, attributes, schema_version, key_map, dropped)


def _scalar(value) -> str | int | float | bool | None:
    """A string, integer, double or boolean value (strings cut); None for arrays, maps, bytes."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return _cut(value.string_value, MAX_VALUE_CHARS)
    if kind in ("int_value", "double_value", "bool_value"):
        return getattr(value, kind)
    return None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + TRUNCATED
