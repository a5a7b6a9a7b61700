"""Bytes per sample on the wire: the OTLP requests pycollector exported (as sent, and gzipped as
its otlp_grpc exporter compresses them by default) against perf's perf.data for the same host and
workload, raw and gzipped. A sample is one tick of one CPU: an OTLP sample's count, a perf
sample record."""

from __future__ import annotations

import gzip
from pathlib import Path

from bench.figures import Row, per_round
from bench.peers import PerfRecord, PycollectorAgent
from bench.truth import exported_samples

# zlib's default level, which gRPC's gzip compression and the gzip command use.
GZIP_LEVEL = 6


def exported_bytes_per_sample(requests: list[bytes]) -> tuple[float, float]:
    """(raw, gzip) bytes per sample; each request is compressed on its own, as gRPC sends it."""
    samples = sum(count for _, _, count in exported_samples(requests))
    raw = sum(len(request) for request in requests)
    compressed = sum(len(gzip.compress(request, GZIP_LEVEL)) for request in requests)
    return raw / samples, compressed / samples


def perf_data_bytes_per_sample(data_path: Path, samples: int) -> tuple[float, float]:
    data = data_path.read_bytes()
    return len(data) / samples, len(gzip.compress(data, GZIP_LEVEL)) / samples


def rows(runs: list) -> list[Row]:
    ours, perf = PycollectorAgent.name, PerfRecord.name
    return [
        Row("Sizes", "Bytes per sample: OTLP request vs perf.data, uncompressed", per_round(runs, ours, "bytes_per_sample"), perf, per_round(runs, perf, "bytes_per_sample"), "{:.1f}"),
        Row("Sizes", "Bytes per sample: OTLP request vs perf.data, gzip", per_round(runs, ours, "gzip_bytes_per_sample"), perf, per_round(runs, perf, "gzip_bytes_per_sample"), "{:.1f}"),
    ]
