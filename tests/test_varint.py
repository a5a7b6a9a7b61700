"""pycollector.varint: the one varint reader (protobuf, DWARF LEB128, Go), bounded."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

from pycollector.otlp.profiles_wire.wire import WireError, read_varint
from pycollector.varint import encode_uvarint
from pycollector.varint import MAX_VARINT_BYTES, VarintError, read_svarint, read_uvarint


def sleb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40):
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_unsigned_values_round_trip(value):
    data = b"\x01" + encode_uvarint(value) + b"\x02"
    assert read_uvarint(data, 1) == (value, len(data) - 1)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_signed_values_round_trip(value):
    data = sleb128(value)
    assert read_svarint(data, 0) == (value, len(data))


@pytest.mark.parametrize("reader", [read_uvarint, read_svarint])
def test_a_long_run_of_continuation_bytes_is_refused_after_the_bound(reader):
    # 200 KB of 0xff took the unbounded reader 3.3 s (each byte shifted an ever longer integer).
    with pytest.raises(VarintError, match="past 10 bytes"):
        reader(b"\xff" * 200_000, 0)
    assert reader(b"\xff" * (MAX_VARINT_BYTES - 1) + b"\x00", 0)[1] == MAX_VARINT_BYTES


def test_a_varint_cut_by_its_end_is_refused():
    data = encode_uvarint(random.getrandbits(40) | 1 << 35)
    with pytest.raises(VarintError):
        read_uvarint(data + b"\x00", 0, end=len(data) - 1)
    with pytest.raises(WireError):  # the protobuf reader says it in its own terms
        read_varint(data, 0, len(data) - 1)
