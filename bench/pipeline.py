"""Pipeline throughput: OTLP profiles streamed to a pycollector process (otlp receiver -> batch ->
otlp_grpc exporter) and on to the bench's sink, against decoding and re-encoding the same payloads
in one Python process (bench.raw_codec), and against a grpcio server that takes the same stream
and does nothing with it (bench.grpc_floor). Two sets of payloads: the bench's large host
reports (bench.payloads) and real agent reports (bench.agent_reports). Streams and peers
alternate, round after round."""

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
from opentelemetry.proto.profiles.v1development import profiles_pb2

from bench import agent_reports, children, payloads, procfs, raw_codec
from bench.figures import Row, Summary
from bench.peers import PYCOLLECTOR
from bench.sink import SERVICE, ProfilesSink
from pycollector.pdata import sample_count

SENDERS = 4  # concurrent clients, as several agents reporting to one gateway
STARTUP_TIMEOUT_S = 30.0
DELIVERY_TIMEOUT_S = 300.0
PEER = "raw protobuf decode+encode"
FLOOR = "grpcio server doing nothing"
PAYLOAD_SETS = ("bench payloads", "agent reports")
# The targets: at least half the rate of decoding and encoding alone, in at most 64 MiB more than
# the collector holds idle.
RSS_ABOVE_IDLE_TARGET_MIB = 64
RATE_TARGET = 0.5
RAW_SAMPLES_PER_SECOND_GUESS = 1_000_000  # sizes the raw peer's run to about a stream's length


@dataclasses.dataclass
class Throughput:
    samples: int
    seconds: float
    cpu_seconds: float
    rss_kib: int  # pipeline: RSS right after the burst; raw: the process's peak


@dataclasses.dataclass
class PipelineRound:
    payloads: str  # one of PAYLOAD_SETS
    pipeline: Throughput
    raw: Throughput
    floor: Throughput
    idle_rss_kib: int  # the collector's, started and not yet sent anything


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def collector_config(port: int, sink_endpoint: str, storage_dir: Path | None = None, workers: int = 1) -> dict:
    """The pipeline measured, in ``workers`` processes (bench.gateway_workers measures more than
    one); with ``storage_dir``, its exporter's queue is in file_storage there."""
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "processors": {"batch": {}},
        # Uncompressed, as the client and the raw peer: the figure is about protobuf handling.
        "exporters": {"otlp_grpc": {"endpoint": sink_endpoint, "tls": {"insecure": True}, "compression": "none"}},
        "service": {
            "pipelines": {"profiles": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["otlp_grpc"]}},
            "telemetry": {"metrics": {"address": "127.0.0.1:0"}},
            "workers": workers,
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


def stream(export, sink: ProfilesSink | None, requests: list[bytes], samples_of: list[int], seconds: float, pid: int) -> Throughput:
    """SENDERS clients send ``requests`` round and round for ``seconds``, each waiting for its
    answer before the next, as agents do; then the time until the sink has every sample (no sink:
    until the last answer). CPU and RSS are process ``pid``'s."""
    if sink is not None:
        sink.take()
    cpu_before = procfs.tree_cpu_seconds(pid)
    sent = [0] * SENDERS
    began = time.perf_counter()

    def send(sender: int) -> None:
        for index in itertools.count(sender, SENDERS):
            if time.perf_counter() - began >= seconds:
                return
            export(requests[index % len(requests)], timeout=DELIVERY_TIMEOUT_S)
            sent[sender] += samples_of[index % len(requests)]

    with futures.ThreadPoolExecutor(SENDERS) as senders:
        list(senders.map(send, range(SENDERS)))
    samples = sum(sent)
    if sink is not None and not sink.wait_for_samples(samples, DELIVERY_TIMEOUT_S):
        raise RuntimeError(f"the sink got {sink.samples} of {samples} samples")
    return Throughput(samples, time.perf_counter() - began, procfs.tree_cpu_seconds(pid) - cpu_before, procfs.memory_kib(pid, "VmRSS"))


def _payload_sets(distinct_payloads: int) -> dict[str, list[bytes]]:
    return {
        "bench payloads": [payloads.build(seed).SerializeToString() for seed in range(distinct_payloads)],
        "agent reports": agent_reports.load(),
    }


def run_rounds(workdir: Path, rounds: int, distinct_payloads: int, seconds: float) -> tuple[list[PipelineRound], dict]:
    """Per payload set, alternating rounds; and what the payloads were like (for the report)."""
    results, shape = [], {"senders": SENDERS, "processes": payloads.PayloadShape().processes, "stream_seconds": seconds}
    for name, requests in _payload_sets(distinct_payloads).items():
        samples_of = [sample_count(profiles_pb2.ProfilesData.FromString(request)) for request in requests]
        key = name.split()[0]
        shape[f"{key}_samples"] = sum(samples_of) // len(requests)
        shape[f"{key}_kib"] = sum(map(len, requests)) // len(requests) // 1024
        shape[f"{key}_count"] = len(requests)
        results += _run_payload_set(workdir / key, name, requests, samples_of, rounds, seconds)
    return results, shape


def _run_payload_set(workdir: Path, name: str, requests: list[bytes], samples_of: list[int], rounds: int, seconds: float) -> list[PipelineRound]:
    workdir.mkdir()
    payload_file = workdir / "payloads.bin"
    raw_codec.write_payloads(payload_file, requests)
    # The raw peer goes through about as many samples as a stream carries.
    raw_count = max(len(requests), int(seconds * RAW_SAMPLES_PER_SECOND_GUESS / (sum(samples_of) / len(requests))))
    port = free_port()
    config_path, log_path = workdir / "pipeline.yaml", workdir / "pipeline.log"
    results = []
    with ProfilesSink(keep_requests=False) as sink:
        config_path.write_text(yaml.safe_dump(collector_config(port, sink.endpoint)))
        with log_path.open("w") as log:
            collector = children.start([str(PYCOLLECTOR), "--config", str(config_path)], stdout=log, stderr=subprocess.STDOUT)
        floor = children.start([sys.executable, "-m", "bench.grpc_floor"], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
        try:
            wait_listening(collector, port, log_path)
            floor_port = int(floor.stdout.readline())
            time.sleep(1.0)  # settled: what it holds with nothing sent
            idle_rss_kib = procfs.memory_kib(collector.pid, "VmRSS")
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, grpc.insecure_channel(f"127.0.0.1:{floor_port}") as floor_channel:
                export = channel.unary_unary(f"/{SERVICE}/Export", response_deserializer=profiles_service_pb2.ExportProfilesServiceResponse.FromString)
                export_to_floor = floor_channel.unary_unary(f"/{SERVICE}/Export", response_deserializer=profiles_service_pb2.ExportProfilesServiceResponse.FromString)
                stream(export, sink, requests, samples_of, min(1.0, seconds), collector.pid)  # warm-up: connections, caches
                stream(export_to_floor, None, requests, samples_of, min(1.0, seconds), floor.pid)
                for index in range(rounds):
                    # Rotate which goes first, so a change in the host's load hits each alike.
                    steps = [
                        lambda: stream(export, sink, requests, samples_of, seconds, collector.pid),
                        lambda: _raw(payload_file, raw_count),
                        lambda: stream(export_to_floor, None, requests, samples_of, seconds, floor.pid),
                    ]
                    order = [(index + step) % 3 for step in range(3)]
                    measured = {step: steps[step]() for step in order}
                    results.append(PipelineRound(name, measured[0], measured[1], measured[2], idle_rss_kib))
                    pipeline, raw, nothing = measured[0], measured[1], measured[2]
                    print(f"bench: pipeline, {name}, round {index + 1}/{rounds}: {pipeline.samples / pipeline.seconds:.0f} samples/s "
                          f"vs raw {raw.samples / raw.seconds:.0f}, grpcio alone {nothing.samples / nothing.seconds:.0f}", file=sys.stderr)
        finally:
            children.stop(collector, floor)
    return results


def _rate_target(_ours: Summary, _peer: Summary, ratio: Summary) -> str:
    verdict = "met" if ratio.median >= RATE_TARGET else f"missed: {RATE_TARGET / ratio.median:.1f}x short"
    return f"≥ {RATE_TARGET:g}x raw: {verdict}"


def _rss_target(ours: Summary, _peer: Summary, _ratio: Summary) -> str:
    verdict = "met" if ours.high <= RSS_ABOVE_IDLE_TARGET_MIB else f"missed by {ours.high - RSS_ABOVE_IDLE_TARGET_MIB:.0f} MiB (the highest round)"
    return f"≤ {RSS_ABOVE_IDLE_TARGET_MIB} MiB: {verdict}"


def rows(results: list[PipelineRound]) -> list[Row]:
    out = []
    for name in PAYLOAD_SETS:
        runs = [result for result in results if result.payloads == name]
        ours = [run.pipeline for run in runs]

        def rate(t: Throughput) -> float:
            return t.samples / t.seconds

        def cpu_us(t: Throughput) -> float:
            return t.cpu_seconds / t.samples * 1e6

        out += [
            Row("Pipeline", f"Samples per second, otlp receiver → batch → otlp_grpc → sink ({name})", list(map(rate, ours)), PEER, [rate(run.raw) for run in runs], "{:.0f}", _rate_target),
            Row("Pipeline", f"Samples per second ({name}), against what grpcio's server takes doing nothing", list(map(rate, ours)), FLOOR, [rate(run.floor) for run in runs], "{:.0f}"),
            Row("Pipeline", f"CPU per sample, µs ({name}; the collector's, the peer's)", list(map(cpu_us, ours)), PEER, [cpu_us(run.raw) for run in runs], "{:.2f}"),
            Row("Pipeline", f"CPU per sample, µs ({name}), against grpcio's server doing nothing", list(map(cpu_us, ours)), FLOOR, [cpu_us(run.floor) for run in runs], "{:.2f}"),
            Row("Pipeline", f"RSS above idle after the stream, MiB ({name})", [(run.pipeline.rss_kib - run.idle_rss_kib) / procfs.KIB_PER_MIB for run in runs], "", [], "{:.0f}", _rss_target),
        ]
    return out
