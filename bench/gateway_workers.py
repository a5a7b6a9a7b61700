"""Gateway workers: the pipeline of bench.pipeline (otlp receiver -> batch -> otlp_grpc -> sink) on
real agent reports from SENDERS clients, each on a connection of its own as separate agents are, to
a gateway of one worker process and to one of a worker per core (service::workers), against raw
decode + encode in one process and grpcio's do-nothing server in the same rounds.

Each round opens new connections: the kernel gives each connection to a worker by a hash of its
addresses (SO_REUSEPORT), so a round's split of 4 connections over the workers is a draw, and the
rounds show its spread. Each client keeps IN_FLIGHT requests going, as an agent's exporter with
its sending queue's consumers does."""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml
from opentelemetry.proto.profiles.v1development import profiles_pb2

from bench import agent_reports, children, procfs, raw_codec
from bench.figures import Row, Summary
from bench.peers import PYCOLLECTOR
from bench.pipeline import FLOOR, PEER, RAW_SAMPLES_PER_SECOND_GUESS, Throughput, _raw, collector_config, free_port, wait_listening
from bench.sink import ProfilesSink
from pycollector.pdata import sample_count
from pycollector.workers.count import usable_cpus

SENDERS = 4
IN_FLIGHT = 2  # requests each client has going at once
DELIVERY_TIMEOUT_S = 300.0
SPEEDUP_TARGET = 1.6  # two workers against one, on two cores
RAW_TARGET = 0.5
RSS_PER_WORKER_TARGET_MIB = 64
SECTION = "Gateway workers"


@dataclasses.dataclass
class HostShare:
    """Where the host's CPUs went while a gateway took a stream, besides the gateway: its
    clients' CPU, this process's (the sink's threads, mostly), and what no one used. On a host
    where the clients run beside the gateway, what the gateway can take is what they leave."""

    clients_cpu_seconds: float = 0.0
    sink_cpu_seconds: float = 0.0
    idle_fraction: float = 0.0


@dataclasses.dataclass
class WorkersRound:
    one: Throughput
    many: Throughput
    raw: Throughput
    floor: Throughput
    workers: int
    rss_above_idle_per_worker_mib: float  # the many-worker gateway's largest worker
    many_host: HostShare = dataclasses.field(default_factory=HostShare)  # during the many-worker stream


class _HostShareWindow:
    """Readings for a HostShare from the moment the clients are told to go to the moment the
    last has sent its stream (not their start-up: their interpreters' imports are not what a
    sample costs them)."""

    def __init__(self, clients: list[subprocess.Popen]):
        self._pids = [client.pid for client in clients]
        self._clients, self._own, self._idle = self._read()

    def _read(self) -> tuple[float, float, tuple[int, int]]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return sum(procfs.tree_cpu_seconds(pid) for pid in self._pids), own.ru_utime + own.ru_stime, _host_idle()

    def finish(self, share: HostShare) -> None:
        """(Before the clients are reaped: a client that exited is still readable until then.)"""
        clients, own, (idle, total) = self._read()
        share.clients_cpu_seconds = clients - self._clients
        share.sink_cpu_seconds = own - self._own
        share.idle_fraction = (idle - self._idle[0]) / max(1, total - self._idle[1])


def _host_idle() -> tuple[int, int]:
    """(idle and iowait ticks, all ticks) of every CPU since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:9]]
    return ticks[3] + ticks[4], sum(ticks)


def stream(endpoint: str, sink: ProfilesSink | None, payload_file: Path, first_samples: int, seconds: float, pid: int,
           share: HostShare | None = None) -> Throughput:
    """SENDERS client processes (bench.gateway_client), each on a connection of its own with
    IN_FLIGHT requests going, for ``seconds``; then until the sink has every sample. CPU is
    process ``pid``'s and its children's. ``share``: filled with where the rest of the host
    went while the clients sent."""
    clients = [children.start([sys.executable, "-m", "bench.gateway_client", endpoint, str(payload_file), str(seconds), str(IN_FLIGHT)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
               for _ in range(SENDERS)]
    try:
        for client in clients:  # (connected, and a first request through, before the clock starts)
            if client.stdout.readline() != "ready\n":
                raise RuntimeError("a bench client did not connect")
        if sink is not None:  # (each client's first request, sent to connect)
            sink.wait_for_samples(SENDERS * first_samples, DELIVERY_TIMEOUT_S)
            sink.take()
        window = _HostShareWindow(clients) if share is not None else None
        cpu_before = procfs.tree_cpu_seconds(pid)
        began = time.perf_counter()
        for client in clients:
            client.stdin.write("go\n")
            client.stdin.flush()
        samples = sum(json.loads(client.stdout.readline())["samples"] for client in clients)
        if window is not None:
            window.finish(share)
        for client in clients:
            client.wait(DELIVERY_TIMEOUT_S)
            children.forget(client)
        if sink is not None and not sink.wait_for_samples(samples, DELIVERY_TIMEOUT_S):
            raise RuntimeError(f"the sink got {sink.samples} of {samples} samples")
        return Throughput(samples, time.perf_counter() - began, procfs.tree_cpu_seconds(pid) - cpu_before, procfs.memory_kib(pid, "VmRSS"))
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()


def _workers_rss_kib(pid: int) -> list[int]:
    return [procfs.memory_kib(child, "VmRSS") for child in procfs._children(pid)]


def run_rounds(workdir: Path, rounds: int, seconds: float) -> list[WorkersRound]:
    workdir.mkdir()
    requests = agent_reports.load()
    samples_of = [sample_count(profiles_pb2.ProfilesData.FromString(request)) for request in requests]
    payload_file = workdir / "payloads.bin"
    raw_codec.write_payloads(payload_file, requests)
    raw_count = max(len(requests), int(seconds * RAW_SAMPLES_PER_SECOND_GUESS / (sum(samples_of) / len(requests))))
    workers = max(2, usable_cpus())
    results = []
    with ProfilesSink(keep_requests=False) as one_sink, ProfilesSink(keep_requests=False) as many_sink:
        gateways = {}
        for count, sink in ((1, one_sink), (workers, many_sink)):
            port = free_port()
            config_path, log_path = workdir / f"workers-{count}.yaml", workdir / f"workers-{count}.log"
            config_path.write_text(yaml.safe_dump(collector_config(port, sink.endpoint, workers=count)))
            with log_path.open("w") as log:
                gateways[count] = (children.start([str(PYCOLLECTOR), "--config", str(config_path)], stdout=log, stderr=subprocess.STDOUT), port, log_path)
        floor = children.start([sys.executable, "-m", "bench.grpc_floor"], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
        try:
            for process, port, log_path in gateways.values():
                wait_listening(process, port, log_path)
            floor_endpoint = f"127.0.0.1:{int(floor.stdout.readline())}"
            (one, one_port, _), (many, many_port, _) = gateways[1], gateways[workers]
            time.sleep(1.0)
            idle_kib = max(_workers_rss_kib(many.pid))
            first = samples_of[0]
            stream(f"127.0.0.1:{one_port}", one_sink, payload_file, first, min(1.0, seconds), one.pid)  # warm-up
            stream(f"127.0.0.1:{many_port}", many_sink, payload_file, first, min(1.0, seconds), many.pid)
            for index in range(rounds):
                share = HostShare()
                steps = [
                    lambda: stream(f"127.0.0.1:{one_port}", one_sink, payload_file, first, seconds, one.pid),
                    lambda: stream(f"127.0.0.1:{many_port}", many_sink, payload_file, first, seconds, many.pid, share),
                    lambda: _raw(payload_file, raw_count),
                    lambda: stream(floor_endpoint, None, payload_file, first, seconds, floor.pid),
                ]
                order = [(index + step) % len(steps) for step in range(len(steps))]
                measured = {}
                for step in order:
                    measured[step] = steps[step]()
                    if step == 1:
                        rss_mib = (max(_workers_rss_kib(many.pid)) - idle_kib) / procfs.KIB_PER_MIB
                results.append(WorkersRound(measured[0], measured[1], measured[2], measured[3], workers, rss_mib, share))
                rate = {name: t.samples / t.seconds for name, t in zip(("one", "many", "raw", "floor"), (measured[0], measured[1], measured[2], measured[3]))}
                print(f"bench: gateway workers, round {index + 1}/{rounds}: 1 worker {rate['one']:.0f} samples/s, {workers} workers {rate['many']:.0f}, "
                      f"raw {rate['raw']:.0f}, grpcio alone {rate['floor']:.0f}", file=sys.stderr)
        finally:
            children.stop(*(process for process, _, _ in gateways.values()), floor)
    return results


def _target(goal: float):
    def verdict(_ours: Summary, _peer: Summary, ratio: Summary) -> str:
        met = "met" if ratio.median >= goal else f"missed: {goal / ratio.median:.2f}x short"
        return f"≥ {goal:g}x: {met}"

    return verdict


def _rss_target(ours: Summary, _peer: Summary, _ratio: Summary) -> str:
    verdict = "met" if ours.high <= RSS_PER_WORKER_TARGET_MIB else f"missed by {ours.high - RSS_PER_WORKER_TARGET_MIB:.0f} MiB (the highest round)"
    return f"≤ {RSS_PER_WORKER_TARGET_MIB} MiB: {verdict}"


def rows(results: list[WorkersRound]) -> list[Row]:
    if not results:
        return []
    workers = results[0].workers

    def rate(t: Throughput) -> float:
        return t.samples / t.seconds

    def cpu_us(t: Throughput) -> float:
        return t.cpu_seconds / t.samples * 1e6

    many = [rate(run.many) for run in results]
    return [
        Row(SECTION, f"Samples per second (agent reports, {SENDERS} clients), {workers} workers against 1", many, "1 worker", [rate(run.one) for run in results], "{:.0f}", _target(SPEEDUP_TARGET)),
        Row(SECTION, f"Samples per second, {workers} workers against raw decode+encode in one process", many, PEER, [rate(run.raw) for run in results], "{:.0f}", _target(RAW_TARGET)),
        Row(SECTION, f"Samples per second, {workers} workers against grpcio's server doing nothing", many, FLOOR, [rate(run.floor) for run in results], "{:.0f}"),
        Row(SECTION, f"CPU per sample, µs, {workers} workers (supervisor included) against 1", [cpu_us(run.many) for run in results], "1 worker", [cpu_us(run.one) for run in results], "{:.2f}"),
        Row(SECTION, "RSS above idle after the stream, MiB, the largest worker", [run.rss_above_idle_per_worker_mib for run in results], "", [], "{:.0f}", _rss_target),
        # Where the rest of the host went meanwhile: the clients and the sink share its CPUs.
        Row(SECTION, f"CPU per sample, µs, the {SENDERS} clients, while {workers} workers take their stream",
            [run.many_host.clients_cpu_seconds / run.many.samples * 1e6 for run in results], "", [], "{:.2f}"),
        Row(SECTION, f"CPU per sample, µs, the sink, while {workers} workers take the stream",
            [run.many_host.sink_cpu_seconds / run.many.samples * 1e6 for run in results], "", [], "{:.2f}"),
        Row(SECTION, f"Host CPU left idle while {workers} workers take the stream, %",
            [100 * run.many_host.idle_fraction for run in results], "", [], "{:.0f}"),
    ]
