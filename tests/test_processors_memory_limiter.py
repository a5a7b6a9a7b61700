"""The memory limiter: its limits, and a real overload in a running in-process pipeline."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import pytest

from pycollector.component import Component, ComponentConfig, Factory, RefusedError
from pycollector.config.validate import build_plan
from pycollector.pdata import ProfilesBuilder
from pycollector.service import Service
from pycollector.testing import registry_with

from processors.memory_limiter import memory
from processors.memory_limiter.config import MemoryLimiterConfig
from processors.memory_limiter.limiter import MIB, limits_for
from tests.components import Journal, factories
from tests.test_processors_support import component, validation_problems

LABELS = {"processor": "memory_limiter"}


# -- configuration and limits --------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, problem",
    [
        ({"limit_mib": 100, "spike_limit_mib": 100}, "processors::memory_limiter::spike_limit_mib: must be smaller than limit_mib (100)"),
        ({"limit_percentage": 50, "spike_limit_percentage": 50}, "processors::memory_limiter::spike_limit_percentage: must be smaller than limit_percentage (50)"),
        ({"limit_percentage": 101}, "processors::memory_limiter::limit_percentage: input should be less than or equal to 100 (got 101)"),
        ({"check_interval": "0s", "limit_mib": 100}, "processors::memory_limiter::check_interval: input should be greater than 0 (got 0.0)"),
        (
            {"min_gc_interval_when_soft_limited": "1s", "min_gc_interval_when_hard_limited": "2s", "limit_mib": 100},
            "processors::memory_limiter::min_gc_interval_when_hard_limited: must not be larger than min_gc_interval_when_soft_limited (got '2s')",
        ),
        ({"min_gc_interval_when_soft_limited": "40s", "limit_mib": 100},
         "processors::memory_limiter: max_gc_interval_when_soft_limited must be at least min_gc_interval_when_soft_limited (or 0 to disable)"),
        ({"max_gc_interval_when_soft_limited": "20s", "limit_mib": 100},
         "processors::memory_limiter: max_gc_interval_when_soft_limited must be at least max_gc_interval_when_hard_limited (when both are set)"),
    ],
)
def test_invalid_limits_are_reported_on_their_key(config, problem):
    assert validation_problems("memory_limiter", {"check_interval": "1s", **config}) == [problem]


def test_check_interval_and_a_limit_are_required_as_in_go():
    assert validation_problems("memory_limiter", {}) == [
        "processors::memory_limiter::check_interval: required key is missing", "processors::memory_limiter::limit_mib: required key is missing"]
    assert validation_problems("memory_limiter", {"check_interval": "1s", "limit_percentage": 80}) == []


def test_limits_follow_go_mib_wins_and_the_spike_defaults_to_a_fifth():
    def available():
        return 1000 * MIB

    assert limits_for(MemoryLimiterConfig(limit_mib=500, limit_percentage=10), available) == limits_for(MemoryLimiterConfig(limit_mib=500, spike_limit_mib=100), available)
    by_share = limits_for(MemoryLimiterConfig(limit_percentage=50, spike_limit_percentage=10), available)
    assert (by_share.hard, by_share.spike, by_share.soft) == (500 * MIB, 100 * MIB, 400 * MIB)
    assert limits_for(MemoryLimiterConfig(), available).hard == 800 * MIB  # nothing set: 80%, see config.py


def test_forced_collections_back_off_while_they_do_not_help_and_reset_once_they_do(monkeypatch):
    """Above the hard limit with collections that free nothing: each one that does not help
    doubles the wait for the next (2, 4, 8 s from a minimum of 1), up to
    max_gc_interval_when_hard_limited; once memory is under the limit, the minimum again."""
    from pycollector.testing import CapturingConsumer, make_settings

    from processors.memory_limiter import limiter as limiter_module
    from processors.memory_limiter.limiter import Limits, MemoryLimiter

    now, used, collections_at = [0.0], [200 * MIB], []
    monkeypatch.setattr(limiter_module.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(memory, "resident_bytes", lambda: used[0])
    monkeypatch.setattr(memory, "trim_heap", lambda: None)
    monkeypatch.setattr(memory, "collect_garbage", lambda: collections_at.append(now[0]))
    config = MemoryLimiterConfig(check_interval="1s", limit_mib=100, min_gc_interval_when_soft_limited="1s", min_gc_interval_when_hard_limited="1s",
                                 max_gc_interval_when_soft_limited="8s", max_gc_interval_when_hard_limited="8s")
    limiter = MemoryLimiter(make_settings("processors", "memory_limiter"), config, CapturingConsumer(), Limits(hard=100 * MIB, spike=20 * MIB))
    for second in range(40):
        now[0] = float(second)
        limiter.check()
    gaps = [later - earlier for earlier, later in zip(collections_at, collections_at[1:])]
    assert gaps[:5] == [2, 4, 8, 8, 8], collections_at
    used[0] = 50 * MIB  # memory went down
    now[0] += 1
    limiter.check()
    assert limiter._gc_interval == {} and not limiter.refusing


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    "files, own_cgroups, expected",
    [
        ({"work.slice/memory.max": "536870912\n"}, "0::/work.slice\n", 512 * MIB),
        ({"memory.max": "max\n"}, "0::/\n", None),
        ({"unified/svc/memory.max": "1073741824\n"}, "1:name=systemd:/svc\n0::/svc\n", 1024 * MIB),
        ({"memory/docker/abc/memory.limit_in_bytes": "268435456\n"}, "4:memory:/docker/abc\n0::/\n", 256 * MIB),
        ({"memory/memory.limit_in_bytes": f"{memory.CGROUP_V1_UNLIMITED}\n"}, "4:memory:/elsewhere\n", None),
    ],
    ids=["v2", "v2-unlimited", "hybrid-unified", "v1", "v1-unlimited"],
)
def test_the_cgroup_limit_is_read_from_v2_the_unified_mount_or_v1(tmp_path, files, own_cgroups, expected):
    for name, text in files.items():
        write(tmp_path / "cgroup" / name, text)
    write(tmp_path / "proc" / "cgroup", own_cgroups)
    assert memory.cgroup_limit_bytes(str(tmp_path / "cgroup"), str(tmp_path / "proc")) == expected


def test_without_a_cgroup_limit_total_memory_is_available(tmp_path):
    write(tmp_path / "meminfo", "MemTotal:       2048 kB\nMemFree:  1 kB\n")
    write(tmp_path / "proc" / "cgroup", "0::/\n")
    assert memory.available_bytes(str(tmp_path / "none"), str(tmp_path / "proc"), str(tmp_path / "meminfo")) == 2048 * 1024


# -- a real overload ------------------------------------------------------------------------------

PAYLOAD_MIB = 1
SEND_EVERY = 0.002  # the sender: up to 1 MiB per 2 ms (500 MiB/s)
# The backend: 1 MiB per 16 ms, eight times slower. The sender builds each message, so a busy host
# slows it and not the backend (a sleep): at 8 ms, ci22's part 1 sent 804 MiB in 8 s, the drain's
# own rate, and memory passed the soft limit twice where five times are asked.
DRAIN_EVERY = 0.016
CHECK_INTERVAL = 0.02
SPIKE_MIB = 48
HEADROOM_MIB = 96  # hard limit above the memory the process holds before the load
OVERSHOOT_BOUND_MIB = 32
RECOVERIES = 5  # times the load must be refused and then accepted again
LOAD_SECONDS_MAX = 20.0  # (five recoveries take under 2 s on a quiet host)


class SlowBackendConfig(ComponentConfig):
    pass


class SlowBackend(Component):
    """An exporter that queues encoded payloads in memory and sends (drops) them slowly."""

    def __init__(self) -> None:
        self.queue: collections.deque[bytes] = collections.deque()
        self.received = 0
        self.draining = threading.Event()  # cleared: hold everything (memory only grows)
        self.draining.set()
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._drain, daemon=True)

    def start(self, host) -> None:
        self._worker.start()

    def consume(self, data) -> None:
        self.queue.append(data.SerializeToString())
        self.received += 1

    def _drain(self) -> None:
        while not self._stop.wait(DRAIN_EVERY):
            if self.queue and self.draining.is_set():
                self.queue.popleft()

    def shutdown(self) -> None:
        self._stop.set()
        if self._worker.is_alive():
            self._worker.join()


class SlowBackendFactory(Factory):
    type = "slow_backend"
    config_model = SlowBackendConfig

    def __init__(self) -> None:
        self.backend = SlowBackend()

    def create(self, settings, config, next_consumer):
        return self.backend


def big_profile(number: int):
    """About 1 MiB, most of it one resource attribute (what a long command line could be)."""
    builder = ProfilesBuilder()
    resource = builder.resource_profiles({"process.command_args": f"{number}:" + "x" * (PAYLOAD_MIB * MIB)})
    profile = builder.profile(builder.scope_profiles(resource))
    builder.sample(profile, builder.stack([builder.location(lines=[(builder.function("work"), 1, 0)])]), [1])
    return builder.data


def send_until_recovered(receiver) -> list[str]:
    """Push ~1 MiB messages as fast as allowed; on a refusal back off and push the same message
    again, as an OTLP client does. Stops once refusals have ended RECOVERIES times (or after
    LOAD_SECONDS_MAX). Returns each push's outcome in order: "accepted" or "refused"."""
    outcomes: list[str] = []
    recoveries, began = 0, time.monotonic()
    while recoveries < RECOVERIES and time.monotonic() - began < LOAD_SECONDS_MAX:
        message, was_refused = big_profile(len(outcomes)), False
        while True:
            time.sleep(SEND_EVERY)
            try:
                receiver.push(message)
            except RefusedError:
                outcomes.append("refused")
                was_refused = True
                continue
            outcomes.append("accepted")
            recoveries += was_refused
            break
    return outcomes


class PeakSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.001):
            self.peak = max(self.peak, memory.resident_bytes())


def test_an_overloaded_pipeline_refuses_at_the_receiver_stays_near_the_limit_and_recovers():
    memory.collect_garbage()
    baseline = memory.resident_bytes()
    limit_mib = baseline // MIB + HEADROOM_MIB
    journal, backend_factory = Journal(), SlowBackendFactory()
    config = {
        "receivers": {"recorder": {}},
        "processors": {"memory_limiter": {"check_interval": f"{CHECK_INTERVAL * 1000:g}ms", "limit_mib": limit_mib, "spike_limit_mib": SPIKE_MIB}},
        "exporters": {"slow_backend": {}},
        "service": {
            "telemetry": {"metrics": {"level": "none"}},
            "pipelines": {"profiles": {"receivers": ["recorder"], "processors": ["memory_limiter"], "exporters": ["slow_backend"]}},
        },
    }
    registry = registry_with(**{**factories(journal), "exporters": {"slow_backend": backend_factory}})
    service = Service(build_plan(config, registry))
    service.start()
    receiver = component(service, "receivers")
    sampler = PeakSampler()
    sampler.start()
    try:
        outcomes = send_until_recovered(receiver)
    finally:
        sampler.done.set()
        sampler.join()
        service.shutdown()

    sent, refused = outcomes.count("accepted"), outcomes.count("refused")
    recoveries = sum(1 for pair in zip(outcomes, outcomes[1:]) if pair == ("refused", "accepted"))
    soft_mib = limit_mib - SPIKE_MIB
    print(
        f"\nbaseline {baseline / MIB:.0f} MiB, soft limit {soft_mib} MiB, limit_mib {limit_mib}, peak {sampler.peak / MIB:.1f} MiB"
        f" ({sampler.peak / MIB - soft_mib:+.1f} over the soft limit, {sampler.peak / MIB - limit_mib:+.1f} over limit_mib);"
        f" {sent} accepted, {refused} refused, {recoveries} recoveries"
    )
    # Refused at the receiver, and data flowed again each time the backend had drained memory.
    assert recoveries >= RECOVERIES, "the load never pushed memory past the soft limit and back"
    assert sampler.peak <= (limit_mib + OVERSHOOT_BOUND_MIB) * MIB
    # Nothing lost without a counter: every accepted message reached the backend, every refusal
    # is counted at the receiver and at the limiter.
    assert backend_factory.backend.received == sent
    telemetry = service.telemetry
    assert telemetry.sample("otelcol_receiver_refused_profile_samples_total", {"receiver": "recorder"}) == refused
    assert telemetry.sample("otelcol_receiver_accepted_profile_samples_total", {"receiver": "recorder"}) == sent
    assert telemetry.sample("otelcol_processor_refused_profile_samples_total", LABELS) == refused
    assert telemetry.sample("otelcol_processor_accepted_profile_samples_total", LABELS) == sent
    assert telemetry.sample("otelcol_processor_memory_limiter_memory_used_bytes", LABELS) > baseline
