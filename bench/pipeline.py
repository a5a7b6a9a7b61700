"""Pipeline throughput: OTLP profiles sent to a pycollector process (otlp receiver -> batch ->
otlp_grpc exporter) and on to the bench's sink, against decoding and re-encoding the same payloads
in one Python process (bench.raw_codec). Bursts and raw runs alternate, round after round."""

from __future__ import annotations

import dataclasses
import itertools
import json
import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import yaml
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

from bench import children, payloads, procfs, raw_codec
from bench.figures import Row, Summary
from bench.peers import PYCOLLECTOR
from bench.sink import SERVICE, ProfilesSink
from pycollector.pdata import sample_count

SENDERS = 4  # concurrent clients, as several agents reporting to one gateway
STARTUP_TIMEOUT_S = 30.0
DELIVERY_TIMEOUT_S = 300.0
PEER = "raw protobuf decode+encode"
# The target: at least half the rate of decoding and encoding alone.
RATE_TARGET = 0.5


@dataclasses.dataclass
class Throughput:
    samples: int
    seconds: float
    cpu_seconds: float
    rss_kib: int  # pipeline: RSS right after the burst; raw: the process's peak


@dataclasses.dataclass
class PipelineRound:
    pipeline: Throughput
    raw: Throughput


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def collector_config(port: int, sink_endpoint: str, storage_dir: Path | None = None) -> dict:
    """The pipeline measured; with ``storage_dir``, its exporter's queue is in file_storage there."""
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "processors": {"batch": {}},
        # Uncompressed, as the client and the raw peer: the figure is about protobuf handling.
        "exporters": {"otlp_grpc": {"endpoint": sink_endpoint, "tls": {"insecure": True}, "compression": "none"}},
        "service": {
            "pipelines": {"profiles": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["otlp_grpc"]}},
            "telemetry": {"metrics": {"address": "127.0.0.1:0"}},
        },
    }
    if storage_dir is not None:
        config["extensions"] = {"file_storage": {"directory": str(storage_dir), "create_directory": True}}
        config["service"]["extensions"] = ["file_storage"]
        config["exporters"]["otlp_grpc"]["sending_queue"] = {"storage": "file_storage"}
    return config


def wait_listening(process: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"pycollector exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"pycollector did not listen on {port} within {STARTUP_TIMEOUT_S:g} s")


def burst(export, sink: ProfilesSink, requests: list[bytes], samples: int, pid: int) -> Throughput:
    """Send ``requests`` from SENDERS clients; the time until the sink has every sample."""
    sink.take()
    cpu_before = procfs.tree_cpu_seconds(pid)
    began = time.perf_counter()
    with futures.ThreadPoolExecutor(SENDERS) as senders:
        list(senders.map(lambda payload: export(payload, timeout=DELIVERY_TIMEOUT_S), requests))
    if not sink.wait_for_samples(samples, DELIVERY_TIMEOUT_S):
        raise RuntimeError(f"the sink got {sink.samples} of {samples} samples")
    seconds = time.perf_counter() - began
    return Throughput(samples, seconds, procfs.tree_cpu_seconds(pid) - cpu_before, procfs.memory_kib(pid, "VmRSS"))


def _raw(payload_file: Path, count: int) -> Throughput:
    done = subprocess.run([sys.executable, "-m", raw_codec.__name__, str(payload_file), str(count)], capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    result = json.loads(done.stdout)
    return Throughput(result["samples"], result["seconds"], result["cpu_seconds"], result["peak_rss_kib"])


def run_rounds(workdir: Path, rounds: int, distinct_payloads: int, payloads_per_burst: int) -> tuple[list[PipelineRound], dict]:
    """Alternating rounds, and what the payloads were like (for the report)."""
    built = [payloads.build(seed) for seed in range(distinct_payloads)]
    encoded = [payload.SerializeToString() for payload in built]
    requests = list(itertools.islice(itertools.cycle(encoded), payloads_per_burst))
    samples = sum(sample_count(payload) for payload in itertools.islice(itertools.cycle(built), payloads_per_burst))
    shape = {"senders": SENDERS, "processes": payloads.PayloadShape().processes, "samples_per_payload": samples // payloads_per_burst, "payload_kib": sum(map(len, requests)) // payloads_per_burst // 1024}
    payload_file = workdir / "payloads.bin"
    raw_codec.write_payloads(payload_file, encoded)

    port = free_port()
    config_path, log_path = workdir / "pipeline.yaml", workdir / "pipeline.log"
    with ProfilesSink(keep_requests=False) as sink:
        config_path.write_text(yaml.safe_dump(collector_config(port, sink.endpoint)))
        with log_path.open("w") as log:
            collector = children.start([str(PYCOLLECTOR), "--config", str(config_path)], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_listening(collector, port, log_path)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                export = channel.unary_unary(f"/{SERVICE}/Export", response_deserializer=profiles_service_pb2.ExportProfilesServiceResponse.FromString)
                burst(export, sink, requests, samples, collector.pid)  # warm-up: connections, caches
                results = []
                for index in range(rounds):
                    # Alternate which goes first, so a change in the host's load hits both alike.
                    if index % 2:
                        raw = _raw(payload_file, len(requests))
                        pipeline = burst(export, sink, requests, samples, collector.pid)
                    else:
                        pipeline = burst(export, sink, requests, samples, collector.pid)
                        raw = _raw(payload_file, len(requests))
                    results.append(PipelineRound(pipeline, raw))
                    print(f"bench: pipeline round {index + 1}/{rounds}: {pipeline.samples / pipeline.seconds:.0f} samples/s vs raw {raw.samples / raw.seconds:.0f}", file=sys.stderr)
        finally:
            children.stop(collector)
    return results, shape


def _rate_target(_ours: Summary, _peer: Summary, ratio: Summary) -> str:
    verdict = "met" if ratio.median >= RATE_TARGET else f"missed: {RATE_TARGET / ratio.median:.1f}x short"
    return f"≥ {RATE_TARGET:g}x raw: {verdict}"


def rows(results: list[PipelineRound]) -> list[Row]:
    def each(figure):
        return [figure(result.pipeline) for result in results], [figure(result.raw) for result in results]

    out = []
    for title, figure, style, target in (
        ("Samples per second, otlp receiver → batch → otlp_grpc → sink", lambda t: t.samples / t.seconds, "{:.0f}", _rate_target),
        ("Samples per CPU second", lambda t: t.samples / t.cpu_seconds, "{:.0f}", None),
        ("RSS at that rate, MiB (collector after each burst; raw: its peak)", lambda t: t.rss_kib / procfs.KIB_PER_MIB, "{:.0f}", None),
    ):
        ours, theirs = each(figure)
        out.append(Row("Pipeline", title, ours, PEER, theirs, style, target))
    return out
