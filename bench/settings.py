"""How long and how often each scenario runs: the full bench (`make bench`) and the quick
smoke run (`python -m bench --quick`), which goes through every step on tiny durations."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Settings:
    name: str
    rounds: int  # each round runs every profiler once, in a rotated order
    workload_seconds: float  # the steady-state window
    # Time between a profiler's first sample and the window, the workload already running:
    # pycollector's first report symbolizes every binary running on the host with cold caches
    # (a few tenths of a CPU second on a quiet host, seconds on a busy one), which is start-up
    # work, not steady state.
    settle_seconds: float
    reporter_interval_s: float  # pycollector's; the window holds at least one report
    side_by_side_seconds: float  # pycollector and perf at once: truth and sizes
    distinct_payloads: int  # pipeline: host reports built for the bursts
    payloads_per_burst: int  # persistent queue: requests per burst
    pipeline_seconds: float  # pipeline: how long each stream runs
    startup_seconds: float  # unwinding start-up: how long the agent runs after its first sample
    agent_memory_seconds: float  # agent memory: how long the agent profiles the busy host
    agent_memory_interval: float  # agent memory: between two readings of its RSS
    agent_memory_every_runtime: bool  # agent memory: the busy host runs every known workload (else C only)
    # How long the warm-up may build the host's unwind rows before the rounds (all of them, on a
    # full run; the quick run only checks the step runs: a busy host's rows take 15-35 s).
    warm_up_limit_s: float = 300.0
    # Memory: malloc(64)+free round trips a run of the loop (heaptrack's run a tenth of them: it
    # records every call), and json dumps+loads round trips of a document of that many orders.
    memory_loop_iterations: int = 20_000_000
    memory_json_round_trips: int = 10
    memory_json_orders: int = 20_000
    hz: int = 97
    # Crowded host: the agent's CPU is measured this long after its start (s, from, to).
    crowded_window: tuple[float, float] = (20.0, 50.0)
    crowded_processes: int = 40  # (the quick run, which tests run beside others, crowds with few)


# The receiver's default reporter_interval (5 s): the settling pause holds the first report
# (intervals are jittered by up to 20%), and the 10 s window about two more.
FULL = Settings("full", rounds=5, workload_seconds=10.0, settle_seconds=7.0, reporter_interval_s=5.0, side_by_side_seconds=5.0, distinct_payloads=6, payloads_per_burst=16, pipeline_seconds=5.0, startup_seconds=4.0, agent_memory_seconds=600.0, agent_memory_interval=30.0, agent_memory_every_runtime=True)
QUICK = Settings("quick", rounds=1, crowded_window=(2.0, 4.0), crowded_processes=2, workload_seconds=1.0, settle_seconds=0.6, reporter_interval_s=0.5, side_by_side_seconds=1.0, distinct_payloads=1, payloads_per_burst=2, pipeline_seconds=0.5, startup_seconds=1.0, agent_memory_seconds=2.0, agent_memory_interval=0.5, agent_memory_every_runtime=False, warm_up_limit_s=5.0,
                memory_loop_iterations=200_000, memory_json_round_trips=1, memory_json_orders=2_000)
