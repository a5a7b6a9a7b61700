"""A collector in several worker processes (service::workers): how many, what each runs, one
metrics page and one health answer for all, a worker killed under load replaced with nothing lost.

The end-to-end tests run pycollector as a gateway (otlp receiver on a loopback port) in front of
a gRPC backend on loopback, and send from 16 client connections, so that both workers get some
(the kernel spreads connections over the workers' sockets by a hash of their addresses)."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from pycollector.component import WorkerSlot
from pycollector.config.errors import ConfigError
from pycollector.config.validate import build_plan
from pycollector.otlp import OTLP_SIGNALS
from pycollector.pdata import iter_samples
from pycollector.pdata.builder import ProfilesBuilder
from pycollector.registry import Registry
from pycollector.testing import make_settings
from pycollector.workers.count import usable_cpus, worker_count
from pycollector.workers.merge import merged_families
from pycollector.workers.plans import supervisor_plan, worker_plan
from tests.test_otlp_support import GrpcBackend, free_port

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
             grpc.StatusCode.ABORTED, grpc.StatusCode.RESOURCE_EXHAUSTED}
CONNECTIONS = 16


def gateway(port: int, **service) -> dict:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {"debug": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["otlp"], "exporters": ["debug"]}}, "telemetry": {"metrics": {"level": "none"}}, **service},
    }


# -- how many workers, and what each runs -----------------------------------------------------------


def test_auto_is_one_worker_per_core_for_a_gateway_and_one_for_an_agent():
    assert worker_count(build_plan(gateway(4317), Registry()), cpus=6) == (6, "one per usable core (6)")
    agent = gateway(4317)
    agent["receivers"] = {"profiling": {}}
    agent["service"]["pipelines"]["profiles"]["receivers"] = ["profiling"]
    count, why = worker_count(build_plan(agent, Registry()), cpus=6)
    assert count == 1 and why.startswith("receivers::profiling: it runs once per collector"), why
    # Port 0 would give each worker a port of its own: auto runs one.
    count, why = worker_count(build_plan(gateway(0), Registry()), cpus=6)
    assert count == 1 and "protocols::grpc::endpoint: port 0" in why


def test_workers_a_receiver_cannot_run_in_are_an_error_naming_it():
    config = gateway(0, workers=3)
    with pytest.raises(ConfigError) as raised:
        worker_count(build_plan(config, Registry()))
    assert "\n  - service::workers: 3 workers cannot each run receivers::otlp: protocols::grpc::endpoint: port 0" in str(raised.value), raised.value
    assert worker_count(build_plan(gateway(4317, workers="${env:WORKERS}".replace("${env:WORKERS}", "2")), Registry())) == (2, "service::workers")
    for wrong in (0, -1, "many", True):
        with pytest.raises(ConfigError, match=r"service::workers: expected 'auto' .* got"):
            build_plan(gateway(4317, workers=wrong), Registry())


def test_usable_cpus_follow_the_cgroup_quotas_above_the_process(tmp_path):
    """The quota of the process's cgroup or of one above it (a unit's CPUQuota=, a pod's limit)."""
    affinity = len(os.sched_getaffinity(0))
    unit = tmp_path / "system.slice" / "gateway.service"
    unit.mkdir(parents=True)
    (unit / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(str(tmp_path), "/system.slice/gateway.service") == affinity
    (tmp_path / "system.slice" / "cpu.max").write_text("50000 100000\n")  # half a CPU: one worker
    assert usable_cpus(str(tmp_path), "/system.slice/gateway.service") == 1
    (tmp_path / "system.slice" / "cpu.max").write_text("max 100000\n")
    (unit / "cpu.max").write_text("150000 100000\n")
    assert usable_cpus(str(tmp_path), "/system.slice/gateway.service") == min(2, affinity)
    assert usable_cpus(str(tmp_path / "absent"), "/") == affinity


def test_health_check_runs_in_the_supervisor_pprof_in_worker_0_storage_in_each():
    config = gateway(4317, extensions=["health_check", "pprof", "file_storage"])
    config["extensions"] = {"health_check": {}, "pprof": {}, "file_storage": {"directory": "/tmp", "create_directory": True}}
    plan = build_plan(config, Registry())
    assert supervisor_plan(plan).extensions == ["health_check"] and not supervisor_plan(plan).pipelines
    first, second = worker_plan(plan, WorkerSlot(0, 2)), worker_plan(plan, WorkerSlot(1, 2))
    assert first.extensions == ["pprof", "file_storage"] and second.extensions == ["file_storage"]
    del config["service"]["telemetry"]  # (the default: localhost:8888, served by the supervisor only)
    plan = build_plan(config, Registry())
    assert supervisor_plan(plan).telemetry.metrics.listen_address() == ("localhost", 8888)
    assert first.pipelines == plan.pipelines and worker_plan(plan, WorkerSlot(0, 2)).telemetry.metrics.listen_address() is None


def test_each_worker_has_a_store_directory_of_its_own_and_worker_0_keeps_a_lone_collectors(tmp_path):
    factory = Registry().load("extensions", "file_storage").factory
    config = factory.config_model.model_validate({"directory": str(tmp_path), "create_directory": True})
    (tmp_path / "worker-5").mkdir()
    (tmp_path / "worker-5" / "exporter_otlp_grpc").write_text("left by a collector of 6 workers")
    directories = []
    for index in range(2):
        settings = make_settings("extensions", "file_storage")
        settings.worker = WorkerSlot(index, 2)
        extension = factory.create(settings, config, None)
        extension.start(None)
        directories.append(extension.directory)
    assert directories == [str(tmp_path), str(tmp_path / "worker-1")] and (tmp_path / "worker-1").is_dir()


def test_memory_limits_are_the_collectors_split_between_its_workers():
    from processors.memory_limiter.limiter import limits_for

    config = Registry().load("processors", "memory_limiter").factory.config_model.model_validate({"check_interval": "1s", "limit_mib": 1000, "spike_limit_mib": 200})
    one, four = limits_for(config, lambda: 0), limits_for(config, lambda: 0, workers=4)
    assert (four.hard, four.spike) == (one.hard // 4, one.spike // 4)


def test_series_of_the_workers_are_added_up_and_uptime_is_the_longest():
    def families(accepted: float, uptime: float, queue: float):
        return [
            ("otelcol_receiver_accepted_items", "counter", "Items accepted", "", [("otelcol_receiver_accepted_items_total", {"receiver": "otlp"}, accepted)]),
            ("otelcol_process_uptime", "counter", "Uptime", "seconds", [("otelcol_process_uptime_seconds_total", {}, uptime)]),
            ("otelcol_exporter_queue_size", "gauge", "Queue", "", [("otelcol_exporter_queue_size", {"exporter": "otlp_grpc"}, queue)]),
        ]

    merged = {metric.name: metric for metric in merged_families([families(10, 5, 3), families(32, 9, 4), families(0, 20, 0)[1:2]])}
    assert [sample.value for sample in merged["otelcol_receiver_accepted_items"].samples] == [42]
    assert [sample.value for sample in merged["otelcol_process_uptime_seconds"].samples] == [20]
    assert [sample.value for sample in merged["otelcol_exporter_queue_size"].samples] == [7]


# -- end to end ------------------------------------------------------------------------------------


class PeerBackend(GrpcBackend):
    """Also counts requests by the peer that sent them (each worker's exporter is one peer)."""

    def __init__(self, *args, **kwargs):
        self.peers: collections.Counter = collections.Counter()
        super().__init__(*args, **kwargs)

    def _handler(self, otlp):
        export = super()._handler(otlp)

        def counting(data, context):
            self.peers[context.peer()] += 1
            return export(data, context)

        return counting


def request(number: int) -> object:
    """One profile whose one sample's value is ``number``: what arrives can be told apart."""
    builder = ProfilesBuilder()
    location = builder.location(lines=[(builder.function("main", filename="main.c"), 1, 0)])
    resource = builder.resource_profiles({"service.name": "checkout", "process.pid": 7})
    profile = builder.profile(builder.scope_profiles(resource, name="test"), period=10_000_000)
    builder.sample(profile, builder.stack([location]), [number])
    return builder.data


class Clients:
    """CONNECTIONS gRPC connections to the gateway (separate subchannels, as separate agents'),
    sending requests numbered from a shared counter, retrying what the gateway does not take."""

    def __init__(self, port: int):
        otlp = OTLP_SIGNALS["profiles"]
        self.channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(CONNECTIONS)]
        self.calls = [channel.unary_unary(otlp.grpc_method, request_serializer=lambda message: message.SerializeToString(),
                                          response_deserializer=otlp.response_type.FromString) for channel in self.channels]
        self.acked: set[int] = set()
        self.errors: collections.Counter = collections.Counter()
        self._numbers = iter(range(1, 1 << 30))
        self._lock = threading.Lock()

    def send(self, count: int) -> None:
        """Send ``count`` more requests, every connection taking its turn, each until taken."""
        threads = [threading.Thread(target=self._send_from, args=(call, count // CONNECTIONS)) for call in self.calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _send_from(self, call, count: int) -> None:
        for _ in range(count):
            with self._lock:
                number = next(self._numbers)
            deadline = time.monotonic() + 60
            while True:
                try:
                    call(request(number), timeout=10, wait_for_ready=True)
                    break
                except grpc.RpcError as error:
                    with self._lock:
                        self.errors[error.code()] += 1
                    assert time.monotonic() < deadline, f"request {number} not taken in 60 s: {error.code()} {error.details()}"
                    time.sleep(0.05)
            with self._lock:
                self.acked.add(number)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def arrived(backend: GrpcBackend) -> set[int]:
    return {view.values[0] for data in list(backend.messages) for view in iter_samples(data)}


def scrape(port: int) -> dict[str, float]:
    """The metrics page's series, by name with labels, as text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line and not line.startswith("#")}


def health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def workers_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def gateway_to(backend: GrpcBackend, port: int, metrics: int, health_port: int, storage: Path | None = None) -> dict:
    exporter = {"endpoint": backend.endpoint, "tls": {"insecure": True}, "timeout": "2s",
                "retry_on_failure": {"initial_interval": "100ms", "max_interval": "500ms", "max_elapsed_time": 0}}
    extensions = {"health_check": {"endpoint": f"127.0.0.1:{health_port}"}}
    if storage is not None:
        extensions["file_storage"] = {"directory": str(storage), "create_directory": True}
        exporter["sending_queue"] = {"storage": "file_storage", "queue_size": 100_000}
    return {
        "extensions": extensions,
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {"otlp_grpc": exporter},
        "service": {
            "workers": 2,
            "extensions": list(extensions),
            "telemetry": {"metrics": {"address": f"127.0.0.1:{metrics}"}},
            "pipelines": {"profiles": {"receivers": ["otlp"], "exporters": ["otlp_grpc"]}},
        },
    }


def wait_for(condition, timeout: float, what: str, log=lambda: ""):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} not within {timeout} s\n{log()}"
        time.sleep(0.02)
    return value


def test_two_workers_share_the_port_and_answer_as_one_collector(collectors):
    port, metrics, health_port = free_port(), free_port(), free_port()
    with PeerBackend() as backend:
        collector = collectors("gateway", gateway_to(backend, port, metrics, health_port))
        wait_for(lambda: "pycollector started" in collector.log(), 30, "start", collector.log)
        assert len(workers_of(collector.process.pid)) == 2
        clients = Clients(port)
        clients.send(160)
        clients.close()
        wait_for(lambda: arrived(backend) >= clients.acked, 20, "every request at the backend", collector.log)
        assert len(backend.peers) == 2, f"requests came from {dict(backend.peers)}: one worker took every connection"
        page = scrape(metrics)
        assert page['otelcol_receiver_accepted_profile_samples_total{receiver="otlp"}'] == 160, page
        assert page['otelcol_exporter_sent_profile_samples_total{exporter="otlp_grpc"}'] == 160, page
        assert page["pycollector_workers"] == 2
        status, body = health(health_port)
        assert status == 200, body
        assert {"receivers::otlp (worker 0)", "receivers::otlp (worker 1)", "exporters::otlp_grpc (worker 1)"} <= set(body["components"]), body
        code, _ = collector.stop()
        assert code == 0, collector.log()
    assert re.search(r"stopped cleanly", collector.log())


def test_a_worker_killed_under_load_is_replaced_within_2s_and_its_queue_loses_nothing(collectors, tmp_path):
    """The backend holds every export until the killed worker is back: the queues then hold what
    the gateway took; the replacement sends its predecessor's."""
    port, metrics, health_port = free_port(), free_port(), free_port()
    with PeerBackend() as backend:
        backend.gate.clear()
        collector = collectors("gateway", gateway_to(backend, port, metrics, health_port, storage=tmp_path / "queue"))
        wait_for(lambda: "pycollector started" in collector.log(), 30, "start", collector.log)
        before = workers_of(collector.process.pid)
        victim = before[1]
        clients = Clients(port)
        sending = threading.Thread(target=clients.send, args=(640,))
        sending.start()
        wait_for(lambda: len(clients.acked) >= 160, 60, "160 requests taken", collector.log)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: len(workers := workers_of(collector.process.pid)) == 2 and victim not in workers, 10, "a replacement process", collector.log)
        replacement = set(workers_of(collector.process.pid)) - set(before)
        wait_for(lambda: "worker replaced" in collector.log(), 10, "the replacement started", collector.log)
        replaced_in = time.monotonic() - killed
        sending.join()
        backend.gate.set()
        wait_for(lambda: arrived(backend) >= clients.acked, 60, "every request taken at the backend", collector.log)
        clients.close()
        print(f"replaced in {replaced_in:.2f} s (pid {victim} -> {replacement}); {len(clients.acked)} requests taken, "
              f"client errors {dict(clients.errors)}; {len(arrived(backend))} arrived")
        assert set(clients.errors) <= RETRYABLE, clients.errors
        assert replaced_in <= 2.0, collector.log()
        page = scrape(metrics)
        assert page["pycollector_worker_restarts_total"] == 1 and page["pycollector_workers"] == 2
        assert health(health_port)[0] == 200


def test_a_killed_supervisor_takes_its_workers_with_it(collectors):
    port = free_port()
    collector = collectors("gateway", gateway(port, workers=2))
    wait_for(lambda: "pycollector started" in collector.log(), 30, "start", collector.log)
    workers = workers_of(collector.process.pid)
    collector.kill()
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 5, "the workers gone")
