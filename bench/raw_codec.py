"""The pipeline's peer: decode and re-encode the same OTLP payloads in one Python process, as
fast as protobuf can. Run as ``python -m bench.raw_codec PAYLOADS COUNT``; prints one JSON line.

PAYLOADS holds serialized ProfilesData, each preceded by its length (4 bytes, little endian)."""

from __future__ import annotations

import itertools
import json
import os
import struct
import sys
import time
from pathlib import Path

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import sample_count

from bench import procfs


def write_payloads(path: Path, payloads: list[bytes]) -> None:
    path.write_bytes(b"".join(struct.pack("<I", len(payload)) + payload for payload in payloads))


def read_payloads(path: Path) -> list[bytes]:
    data, payloads, offset = path.read_bytes(), [], 0
    while offset < len(data):
        (size,) = struct.unpack_from("<I", data, offset)
        payloads.append(data[offset + 4: offset + 4 + size])
        offset += 4 + size
    return payloads


def main(path: str, count: str) -> None:
    payloads = read_payloads(Path(path))
    samples_of = {id(payload): sample_count(profiles_pb2.ProfilesData.FromString(payload)) for payload in payloads}
    samples = 0
    began, began_cpu = time.perf_counter(), time.process_time()
    for payload in itertools.islice(itertools.cycle(payloads), int(count)):
        profiles_pb2.ProfilesData.FromString(payload).SerializeToString()
        samples += samples_of[id(payload)]
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - began_cpu
    print(json.dumps({"samples": samples, "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_kib": procfs.memory_kib(os.getpid(), "VmHWM")}))


if __name__ == "__main__":
    main(*sys.argv[1:])
