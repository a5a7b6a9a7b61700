"""Profiling receiver settings: the Go receiver's keys, its older CamelCase keys, and keys that
are accepted but not implemented yet (logged once, never silently ignored)."""

import pytest

from pycollector.config.validate import build_plan
from pycollector.registry import Registry
from pycollector.config import ConfigError
from pycollector.testing import CapturingConsumer, TestHost, make_settings

from receivers.profiling.config import ProfilingConfig
from receivers.profiling.factory import factory


def test_go_defaults():
    config = ProfilingConfig()
    assert (config.samples_per_second, config.reporter_interval, config.reporter_jitter) == (20, 5.0, 0.2)
    assert config.not_implemented() == [] and config.legacy_keys_used == []


def test_legacy_camel_case_keys_map_to_todays_keys():
    config = ProfilingConfig.model_validate({"SamplesPerSecond": 97, "Tracers": "perl,php", "BpfVerifierLogLevel": 1})
    assert (config.samples_per_second, config.tracers, config.bpf_verifier_log_level) == (97, "perl,php", 1)
    assert config.legacy_keys_used == ["SamplesPerSecond", "Tracers", "BpfVerifierLogLevel"]
    assert config.not_implemented() == [] and config.unsupported_tracers() == ["perl", "php"]
    assert not config.python_frames() and not config.tracer_enabled("go")


@pytest.mark.parametrize(
    "settings, python",
    [({}, True), ({"tracers": "all"}, True), ({"tracers": "perl,python"}, True), ({"Tracers": "php"}, False),
     ({"interpreters": {"python": {"enabled": False}}}, False), ({"interpreters": {"python": False}}, False),
     ({"interpreters": {"python": {}}}, True)],
)
def test_tracers_and_interpreters_turn_python_frames_on_and_off(settings, python):
    assert ProfilingConfig.model_validate(settings).python_frames() is python


def test_memory_profiling_is_off_unless_asked():
    assert not ProfilingConfig().lock_profiling and not ProfilingConfig().io_profiling
    assert not ProfilingConfig().thread_profiling and ProfilingConfig.model_validate({"thread_profiling": True}).thread_profiling
    assert ProfilingConfig.model_validate({"lock_profiling": True, "io_profiling": True, "wait_events_per_second": 50}).wait_events_per_second == 50
    assert not ProfilingConfig().allocation_profiling and not ProfilingConfig().live_heap_profiling
    config = ProfilingConfig.model_validate({"allocation_profiling": True, "live_heap_profiling": True})
    assert config.allocation_profiling and config.live_heap_profiling


def test_tracers_name_each_runtime_and_the_unsupported_ones_are_listed_by_name():
    config = ProfilingConfig.model_validate({"tracers": "perl,php,python,hotspot,ruby,v8,dotnet,go", "interpreters": {"beam": {}, "go": {"enabled": False}}})
    assert [config.tracer_enabled(name) for name in ("python", "go", "v8", "hotspot")] == [True, False, True, True]
    assert config.unsupported_tracers() == ["perl", "php", "ruby", "dotnet", "beam"]
    assert ProfilingConfig().unsupported_tracers() == [] and ProfilingConfig(tracers="all").unsupported_tracers() == []


@pytest.mark.parametrize(
    "settings, problem",
    [
        ({"samples_per_second": 0}, "receivers::profiling::samples_per_second: input should be greater than or equal to 1 (got 0)"),
        ({"map_scale_factor": 9}, "receivers::profiling::map_scale_factor: input should be less than or equal to 8 (got 9)"),
        ({"off_cpu_threshold": 2}, "receivers::profiling::off_cpu_threshold: input should be less than or equal to 1 (got 2)"),
        ({"unwind_max_frames": 481}, "receivers::profiling::unwind_max_frames: input should be less than or equal to 480 (got 481)"),
        ({"unwind_row_budget": 10}, "receivers::profiling::unwind_row_budget: input should be greater than or equal to 1024 (got 10)"),
        ({"reporter_interval": "5"}, "receivers::profiling::reporter_interval: invalid duration '5': use a number and a unit (ns, us, ms, s, m, h), e.g. '1m30s'"),
        ({"error_mode": "panic"}, "receivers::profiling::error_mode: input should be 'propagate' or 'ignore' (got 'panic')"),
        ({"probabilistic_threshold": 0}, "receivers::profiling::probabilistic_threshold: input should be greater than or equal to 1 (got 0)"),
        ({"probabilistic_interval": "100ms"}, "receivers::profiling::probabilistic_interval: input should be greater than or equal to 1 (got 0.1)"),
        ({"live_heap_profiling": True}, "receivers::profiling::live_heap_profiling: needs allocation_profiling: true as well (the live heap is made "
                                        "of the sampled allocations) (got True)"),
    ],
)
def test_bad_values_name_their_key(settings, problem):
    config = {"receivers": {"profiling": settings}, "exporters": {"debug": {}}, "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["debug"]}}}}
    with pytest.raises(ConfigError) as raised:
        build_plan(config, Registry())
    assert raised.value.problems == [problem]


@pytest.mark.bpf
def test_deprecated_and_unimplemented_keys_are_logged_once_at_start(log_output):
    config = ProfilingConfig.model_validate({"SamplesPerSecond": 49, "send_error_frames": True, "interpreters": {"ruby": {}}, "reporter_interval": "200ms"})
    for _ in range(2):  # two receivers in one process: still one warning per key
        receiver = factory.create(make_settings("receivers", "profiling"), config, CapturingConsumer())
        receiver.start(TestHost())
        receiver.shutdown()
    lines = log_output.getvalue().splitlines()

    def count(event, field):
        return sum(1 for line in lines if event in line and field in line)

    assert count("deprecated key; use the snake_case name", "key=SamplesPerSecond") == 1
    assert count("setting accepted but not implemented yet; it has no effect", "key=send_error_frames") == 1
    assert count("this runtime's frames are not read yet", "tracer=ruby") == 1
