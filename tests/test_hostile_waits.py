"""Hostile waits (issue 44), with real BPF: an ordinary user's process that floods the lock_wait
profile, beside root's benign processes that measure themselves. The arena of
tests/test_hostile_host.py (the agent in this process, a report a second, its benign busy
program), with lock_profiling and io_profiling on:

- a process making futex waits as fast as two CPUs let it (ping-pong pairs: every hand-over a
  FUTEX_WAIT that sleeps);
- a process of 10,000 threads, each in a futex wait woken once a second, their wake-ups spread.

Throughout: a report every interval, the agent's memory within 64 MiB (the arena's checks); the
attacker's waits past its budget counted (waits_throttled), the maps bounded; and root's benign
processes started during the attack unaffected: a mutex contention's lock_wait within 10% of the
wait its threads measured, and a CPU-bound program's CPU samples as many as the CPU time the
kernel counted for it (its rusage) gives at the sampling rate, within a Poisson count's spread.
"""

from __future__ import annotations

import collections
import os
import subprocess
import time
from pathlib import Path

import pytest

from pycollector.pdata import iter_samples, sample_type

from tests.conftest import WORKLOADS, samples_match_cpu_time, stolen_seconds, wait_for
from tests.test_hostile_host import NOBODY, compile_c, running_arena
from tests.test_lock_io_waits import waits_by_site

pytestmark = pytest.mark.bpf

WAITS = Path(__file__).parent / "testdata" / "waits"
HZ = 499  # (the benign CPU-bound program's samples many enough for a 10% comparison)
BUDGET = 1000  # wait_events_per_second, the default
THREADS = 10_000


@pytest.fixture(scope="module")
def arena():
    # Only the arena's processes profiled (all started from its folder: the benign programs and the
    # attacker): on a shared CI host (load 6 to 13 here) the rest of the host's samples at HZ made
    # the report thread, starved of CPU by the attack, miss reports for reasons not the attack's.
    yield from running_arena({"lock_profiling": True, "io_profiling": True, "samples_per_second": HZ, "wait_events_per_second": BUDGET,
                              "process_filter": {"command_line": "pycollector-hostile-"}})


def build(arena, name: str) -> Path:
    out = arena.root / name
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", str(out), str(WAITS / f"{name}.c")], check=True,
                   capture_output=True)
    return out


def attack_beside_benign(arena, attacker_argv: list) -> dict:
    """The attack by ``attacker_argv`` (as nobody) and, a second into it, root's benign programs:
    lock_contention (2 s of a mutex held 5 ms by turns) and known_split (3 s of CPU). What each
    measured, what the agent exported of them, its counters before and after, the attacker."""
    lock_program = build(arena, "lock_contention")
    cpu_program = compile_c((WORKLOADS / "known_split.c").read_text(), arena.root / "benign_cpu", "-fno-omit-frame-pointer")
    # Started before the attack, each waiting for a line to exec its program: profiled from then on
    # (process_filter: a process is a target once the agent has seen it, which an attack that
    # keeps the events thread busy delays; a process that execs stays one).
    started = {"lock": subprocess.Popen(["sh", "-c", f"read go && exec {lock_program} 2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True),
               "cpu": subprocess.Popen(["sh", "-c", f"read go && exec {cpu_program} 3"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)}
    targeting = arena.receiver.targeting
    assert wait_for(lambda: all(process.pid in targeting._targets for process in started.values())), "the benign programs are targets"

    def attacker_then_benign() -> subprocess.Popen:
        attacker = arena.as_nobody(attacker_argv)
        time.sleep(1.0)  # (the attack under way)
        for process in started.values():
            process.stdin.write("go\n")
            process.stdin.close()
        return attacker

    before, stolen_before = arena.receiver._sampler.counters(), stolen_seconds()
    try:
        exported, attacker = arena.attack(attacker_then_benign)
        lock_printed = started["lock"].stdout.read()
        started["lock"].wait(60)
        _pid, status, usage = os.wait4(started["cpu"].pid, 0)
        started["cpu"].returncode = os.waitstatus_to_exitcode(status)
        # Their last reports: three more (a report may hold a process back once while its files
        # are read; a host this busy may build one late).
        reports = len(arena.capture.consumer.messages)
        arena.capture.consumer.wait_for(lambda consumer: len(consumer.messages) >= reports + 3, timeout=60)
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    after, stolen = arena.receiver._sampler.counters(), stolen_seconds() - stolen_before
    return {
        "attacker": attacker,
        "attacker_said": dict(line.split() for line in attacker.stderr.read().decode().splitlines() if len(line.split()) == 2),
        "lock": (started["lock"].pid, {name: int(value) for name, value in (line.split() for line in lock_printed.splitlines())}),
        "cpu": (started["cpu"].pid, usage.ru_utime + usage.ru_stime),
        "stolen_s": stolen,
        "messages": list(arena.capture.consumer.messages),
        "exported": exported,
        "counters": {name: after.get(name, 0) - before.get(name, 0) for name in after},
    }


def lock_waits(messages, pid: int) -> collections.Counter:
    """{(innermost of wait_for_the_lock / hold_the_lock / wait_for_the_signal, lock.kind): ns}."""
    return waits_by_site(messages, pid, "lock_wait", ("wait_for_the_lock", "hold_the_lock", "wait_for_the_signal"))


def cpu_samples(messages, pid: int) -> int:
    return sum(sum(view.values) for message in messages for view in iter_samples(message)
               if view.resource.get("process.pid") == pid and sample_type(message, view.profile)[0] == "samples")


EXCESS_SHARE = 1.25  # (assert_benign_unaffected says why)


def assert_benign_unaffected(run: dict) -> None:
    lock_pid, measured = run["lock"]
    waits = lock_waits(run["messages"], lock_pid)
    mutex = waits[("wait_for_the_lock", "mutex")]
    cpu_pid, cpu_seconds = run["cpu"]
    samples = cpu_samples(run["messages"], cpu_pid)
    by_report = [round(value / 1e9, 3) for value in (sum(lock_waits([message], lock_pid).values()) for message in run["messages"]) if value]
    print(f"benign: lock waits by report {by_report}")
    print(f"benign: mutex waits measured {measured['mutex_wait_ns']} ns, profiled {mutex} ns; CPU {cpu_seconds:.3f} s by rusage, "
          f"{samples} samples at {HZ} Hz = {samples / HZ:.3f} s; {run['stolen_s']:.2f} s stolen by the hypervisor meanwhile; attacker said {run['attacker_said']}; counters changed {run['counters']}")
    assert abs(mutex - measured["mutex_wait_ns"]) <= 0.1 * measured["mutex_wait_ns"], waits
    # Beside an attack switching 100k times a second the program runs in short pieces, each
    # sampled by the timer or not: its count strays as a Poisson count does (ci24: 412 samples
    # where 365 were due), and as far again as the time the hypervisor stole meanwhile moves it
    # (stolen_seconds). A process whose samples the attack took would lose far more: that side
    # is held as tight. More samples than its CPU time is not what an attack does to it, and
    # beside the storm it happens past the Poisson bound: 493 where its rusage gave 409 with no
    # time stolen (ci3 of session 32), 515 where 440 (earlier). Why is not settled (this kernel
    # has no IRQ time accounting: an interrupt's time is the interrupted task's in both); up to
    # a quarter more is taken as that.
    due = cpu_seconds * HZ
    assert samples_match_cpu_time(samples, HZ, cpu_seconds, run["stolen_s"]) or due < samples <= EXCESS_SHARE * due, \
        (samples, due, run["stolen_s"])


def attacker_lock_wait(run: dict) -> int:
    return sum(sum(view.values) for message in run["messages"] for view in iter_samples(message)
               if view.resource.get("process.pid") == run["attacker"].pid and sample_type(message, view.profile)[0] == "lock_wait")


def test_a_flood_of_futex_waits_costs_only_its_own_profile(arena):
    """The storm's waits past its budget are counted, not recorded; root's programs beside it
    are profiled as they measure themselves."""
    program = build(arena, "futex_storm")
    os.chown(program, NOBODY, NOBODY)
    run = attack_beside_benign(arena, [str(program), "4.5"])
    said = run["attacker_said"]
    print(f"the storm: {int(said['sleeping_waits']) / float(said['seconds']):,.0f} futex waits a second, each a switch off a CPU")
    assert int(said["sleeping_waits"]) > 20 * BUDGET * float(said["seconds"]), "a storm far past the budget"
    assert run["counters"]["waits_throttled"] > 10 * BUDGET, run["counters"]
    assert attacker_lock_wait(run) > 0, "its own waits, up to its budget, are still profiled"
    assert_benign_unaffected(run)


def test_ten_thousand_threads_in_futex_waits_cost_only_their_own_profile(arena):
    """10,000 threads each woken once a second (10,000 lock waits a second): the process's
    budget holds, the off-CPU map keeps room (its full-map drops counted), root's programs
    beside it are profiled as they measure themselves."""
    program = build(arena, "many_threads")
    os.chown(program, NOBODY, NOBODY)
    run = attack_beside_benign(arena, [str(program), str(THREADS)])
    assert int(run["attacker_said"].get("threads", 0)) == THREADS, run["attacker_said"]
    assert run["counters"]["waits_throttled"] > 5 * BUDGET, run["counters"]
    assert attacker_lock_wait(run) > 0
    assert_benign_unaffected(run)
