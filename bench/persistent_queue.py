"""The persistent sending queue's cost: the pipeline of bench.pipeline run twice side by side,
its exporter's queue in memory in one collector and in file_storage (SQLite, WAL) in the other,
the same bursts sent to each in turn, round after round. Besides the rate, the bytes each
collector wrote to the disk per sample (/proc/PID/io write_bytes: the WAL, its checkpoints)."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
from pathlib import Path

import grpc
import yaml
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

from bench import children, payloads
from bench.figures import Row
from bench.peers import PYCOLLECTOR
from bench.pipeline import Throughput, burst, collector_config, free_port, wait_listening
from bench.sink import SERVICE, ProfilesSink
from pycollector.pdata import sample_count

PEER = "the same pipeline, queue in memory"


@dataclasses.dataclass
class QueueRound:
    persistent: Throughput
    memory: Throughput
    persistent_bytes_written: int
    memory_bytes_written: int


def _bytes_written(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def run_rounds(workdir: Path, rounds: int, distinct_payloads: int, payloads_per_burst: int) -> list[QueueRound]:
    built = [payloads.build(seed) for seed in range(distinct_payloads)]
    requests = list(itertools.islice(itertools.cycle([payload.SerializeToString() for payload in built]), payloads_per_burst))
    samples = sum(sample_count(payload) for payload in itertools.islice(itertools.cycle(built), payloads_per_burst))
    results = []
    with ProfilesSink(keep_requests=False) as sink:
        collectors, exports, channels = {}, {}, []
        try:
            for kind in ("persistent", "memory"):
                port = free_port()
                config = collector_config(port, sink.endpoint, workdir / "storage" if kind == "persistent" else None)
                config_path, log_path = workdir / f"{kind}.yaml", workdir / f"{kind}.log"
                config_path.write_text(yaml.safe_dump(config))
                with log_path.open("w") as log:
                    collectors[kind] = children.start([str(PYCOLLECTOR), "--config", str(config_path)], stdout=log, stderr=subprocess.STDOUT)
                wait_listening(collectors[kind], port, log_path)
                channel = grpc.insecure_channel(f"127.0.0.1:{port}")
                channels.append(channel)
                exports[kind] = channel.unary_unary(f"/{SERVICE}/Export", response_deserializer=profiles_service_pb2.ExportProfilesServiceResponse.FromString)
                burst(exports[kind], sink, requests, samples, collectors[kind].pid)  # warm-up
            for index in range(rounds):
                measured = {}
                for kind in ("persistent", "memory") if index % 2 == 0 else ("memory", "persistent"):
                    written = _bytes_written(collectors[kind].pid)
                    throughput = burst(exports[kind], sink, requests, samples, collectors[kind].pid)
                    measured[kind] = (throughput, _bytes_written(collectors[kind].pid) - written)
                results.append(QueueRound(measured["persistent"][0], measured["memory"][0], measured["persistent"][1], measured["memory"][1]))
                rate = {kind: value[0].samples / value[0].seconds for kind, value in measured.items()}
                print(f"bench: persistent queue round {index + 1}/{rounds}: {rate['persistent']:.0f} samples/s vs {rate['memory']:.0f} in memory", file=sys.stderr)
        finally:
            for channel in channels:
                channel.close()
            children.stop(*collectors.values())
    return results


def rows(results: list[QueueRound]) -> list[Row]:
    return [
        Row("Persistent queue", "Samples per second, otlp → batch → otlp_grpc with sending_queue in file_storage",
            [r.persistent.samples / r.persistent.seconds for r in results], PEER, [r.memory.samples / r.memory.seconds for r in results], "{:.0f}"),
        Row("Persistent queue", "Bytes written to disk per sample (/proc/PID/io write_bytes)",
            [r.persistent_bytes_written / r.persistent.samples for r in results], PEER, [r.memory_bytes_written / r.memory.samples for r in results], "{:.1f}"),
    ]
