"""Attacks through memory profiling (issue 39: "hostile input, run as an unprivileged user"): a
program declaring thousands of otel_memory probes, some of them garbage, that fires them with
random pointers, sizes and weights and frees pointers it never allocated; a program leaking as
fast as it can with every allocation sampled. Each spoils only its own memory profiles.

The arena is test_hostile_host's (the agent in this process, reporting every second; a busy
program beside every attack; the attacker user nobody; a report every interval and resident
memory within 64 MiB checked throughout), with allocation and live-heap profiling on, and one more
benign process: the memory tests' workload under the native sampler, whose leaked blocks must
stay in the live heap, their bytes within 10%, in every report of every attack.
"""

from __future__ import annotations

import collections
import os
import subprocess
from pathlib import Path

import pytest

from pycollector.pdata import iter_samples, sample_type

from tests.test_hostile_host import running_arena

pytestmark = pytest.mark.bpf

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "sdk" / "native" / "build" / "libpycollector_heap.so"
WORKLOAD = REPO / "tests" / "testdata" / "memory" / "heap_profile.c"
# The benign workload's: 128 MiB at an 8 KiB interval, 16,000 sampled allocations at once (the
# arena's allocation_events_per_second lets them all be walked: the live heap leaves throttled ones out).
TOTAL_MIB, INTERVAL = 128, 8192
EVENTS_PER_SECOND = 20_000
PROBES = 600  # of each kind, alloc and free: 1,200 notes, past the 1,024 a file is read for

# The forger: PROBES alloc and PROBES free probe sites with their semaphores, fired in turn with
# random arguments while a profiler listens, and notes no compiler writes: a probe whose pc is
# outside any code, arguments that do not parse, a descriptor cut short.
FORGER_HEAD = r"""
#define _SDT_HAS_SEMAPHORES 1
#include <stdint.h>
#include <stdlib.h>
#include <sys/sdt.h>
#include <time.h>
unsigned short otel_memory_alloc_semaphore __attribute__((section(".probes"))) __attribute__((used));
unsigned short otel_memory_free_semaphore __attribute__((section(".probes"))) __attribute__((used));
static uint64_t state = 88172645463325252ull;
static uint64_t random64(void) { state ^= state << 13; state ^= state >> 7; state ^= state << 17; return state; }
__asm__(".pushsection .note.stapsdt,\"?\",\"note\"\n"
        ".balign 4\n.4byte 2f-1f, 4f-3f, 3\n1: .asciz \"stapsdt\"\n2: .balign 4\n"
        "3: .8byte 0x10, _.stapsdt.base, 0\n.asciz \"otel_memory\"\n.asciz \"alloc\"\n.asciz \"8@%rax 8@%rbx\"\n4: .balign 4\n"
        ".balign 4\n.4byte 6f-5f, 8f-7f, 3\n5: .asciz \"stapsdt\"\n6: .balign 4\n"
        "7: .8byte 0x401000, _.stapsdt.base, 0\n.asciz \"otel_memory\"\n.asciz \"alloc\"\n.asciz \"@@%zz -9@(%%q) 8@sym(%rip)\"\n8: .balign 4\n"
        ".balign 4\n.4byte 10f-9f, 12f-11f, 3\n9: .asciz \"stapsdt\"\n10: .balign 4\n"
        "11: .8byte 0x401000\n12: .balign 4\n"
        ".popsection");
static void fire(unsigned which, uint64_t ptr, uint64_t size, uint64_t weight) {
    switch (which) {
"""
FORGER_TAIL = r"""
    }
}
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 30;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        for (int i = 0; i < 1000; i++)
            fire(random64() % (2 * PROBES), random64(), random64() >> 20, random64() >> 16);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
"""

# Leaks 64-byte blocks as fast as it can (at a 64-byte interval each is a sampled allocation that
# stays alive), up to 4 GiB of them, for argv[1] seconds.
FLOOD_C = r"""
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 30;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    unsigned long leaked = 0;
    do {
        for (int i = 0; i < 1000 && leaked < (4ul << 30); i++, leaked += 64)
            sink += (unsigned long)malloc(64);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
"""


def forger_source() -> str:
    cases = []
    for n in range(2 * PROBES):  # (alternating: the probes attached, the first of its notes, are of both kinds)
        if n % 2 == 0:
            cases.append(f"    case {n}: if (otel_memory_alloc_semaphore) STAP_PROBE3(otel_memory, alloc, ptr, size, weight); break;")
        else:
            cases.append(f"    case {n}: if (otel_memory_free_semaphore) STAP_PROBE1(otel_memory, free, ptr); break;")
    return f"#define PROBES {PROBES}\n" + FORGER_HEAD + "\n".join(cases) + FORGER_TAIL


@pytest.fixture(scope="module")
def arena():
    if not LIBRARY.exists():
        subprocess.run(["make", "-s", "-C", str(LIBRARY.parent.parent)], check=True, capture_output=True)
    yield from running_arena({"allocation_profiling": True, "live_heap_profiling": True, "allocation_events_per_second": EVENTS_PER_SECOND})


@pytest.fixture(scope="module")
def leaker(arena):
    """The benign workload, its leaked blocks alive in the live heap: (its process, bytes leaked)."""
    program = arena.root / "heap_profile"
    subprocess.run(["gcc", "-O2", "-g", "-rdynamic", "-o", str(program), str(WORKLOAD), "-lm"], check=True, capture_output=True)
    process = subprocess.Popen([str(program), str(TOTAL_MIB)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "LD_PRELOAD": str(LIBRARY), "PYCOLLECTOR_HEAP_SAMPLE_BYTES": str(INTERVAL)})
    try:
        memory = arena.receiver.memory
        assert process.stdout.readline() == "ready\n"
        assert _wait(lambda: memory.attached(process.pid) == 2), memory.stats
        memory.wait_idle(10)
        process.send_signal(__import__("signal").SIGUSR1)
        lines = dict(process.stdout.readline().rsplit(" ", 1) for _ in range(4))
        yield process, int(lines["leaked"])
    finally:
        process.kill()
        process.wait()


def _wait(condition, timeout: float = 15.0) -> bool:
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)
    return condition()


def in_use(messages, pid: int) -> list[int]:
    """The inuse_space total of ``pid`` in each message that has one."""
    out = []
    for message in messages:
        total = [sum(view.values) for view in iter_samples(message)
                 if view.resource.get("process.pid") == pid and sample_type(message, view.profile)[0] == "inuse_space"]
        if total:
            out.append(sum(total))
    return out


def check_the_leaker_whole(exported, leaker) -> None:
    process, leaked = leaker
    held = in_use(exported, process.pid)
    assert len(held) >= len(exported) - 1, f"the leaker's live heap in {len(held)} of {len(exported)} reports"
    assert all(abs(total - leaked) <= 0.1 * leaked for total in held), (held, leaked)


def test_thousands_of_forged_probes_fired_with_garbage_spoil_only_the_forgers_profiles(arena, leaker, tmp_path):
    """The forger declares 1,200 probes and three notes no compiler writes, and fires its
    attached probes with random pointers, sizes and weights, and frees of pointers it never
    allocated: 1,024 notes are read, 64 probes attached, the garbage counted; its frees take
    nothing from the leaker's live heap."""
    source = tmp_path / "forger.c"
    source.write_text(forger_source())
    forger = arena.root / "forger"
    subprocess.run(["gcc", "-O1", "-o", str(forger), str(source)], check=True, capture_output=True)
    forger.chmod(0o755)
    receiver = arena.receiver
    before, memory_before = receiver._sampler.counters(), dict(receiver.memory.stats)
    attached = []

    def start():
        attacker = arena.as_nobody([str(forger), "30"])
        attached.append(_wait(lambda: receiver.memory.attached(attacker.pid) > 0, 5) and receiver.memory.attached(attacker.pid))
        return attacker

    exported, attacker = arena.attack(start)
    d = {name: value - before[name] for name, value in receiver._sampler.counters().items()}
    m = {name: value - memory_before.get(name, 0) for name, value in receiver.memory.stats.items()}
    print(f"attached {attached}; kernel {{'memory_allocs': {d['memory_allocs']}, 'memory_frees_unknown': {d['memory_frees_unknown']}, "
          f"'memory_throttled': {d['memory_throttled']}, 'live_process_full': {d['live_process_full']}}}; attacher {m}")
    assert attached and 0 < attached[0] <= 64, "no more than 64 of its probes attached"
    assert m["probes_over_limit"] > 0 and m["worker_errors"] == 0 and m["attach_errors"] == 0, m
    assert d["memory_frees_unknown"] > 1000, "its frees of pointers it never allocated: counted"
    assert d["live_heap_full"] == 0 and d["memory_budgets_full"] == 0, d
    check_the_leaker_whole(exported, leaker)


def test_a_flood_of_leaked_sampled_allocations_fills_only_its_own_share(arena, leaker):
    """The flood leaks 64-byte blocks as fast as it can under the native sampler at a 64-byte
    interval: it is throttled to its events a second, holds at most its eighth of the live heap,
    and the leaker's live heap stays whole."""
    flood = arena.root / "flood"
    (arena.root / "flood.c").write_text(FLOOD_C)
    subprocess.run(["gcc", "-O2", "-o", str(flood), str(arena.root / "flood.c")], check=True, capture_output=True)
    receiver = arena.receiver
    before = receiver._sampler.counters()
    exported, attacker = arena.attack(lambda: arena.as_nobody([str(flood), "30"], env={**os.environ, "LD_PRELOAD": str(LIBRARY),
                                                                                       "PYCOLLECTOR_HEAP_SAMPLE_BYTES": "64"}))
    d = {name: value - before[name] for name, value in receiver._sampler.counters().items()}
    held = collections.Counter()
    for message in exported[-2:]:
        for view in iter_samples(message):
            if view.resource.get("process.pid") == attacker.pid and sample_type(message, view.profile)[0] == "inuse_objects":
                held[id(message)] += sum(view.values)
    print(f"kernel: memory_allocs {d['memory_allocs']}, throttled {d['memory_throttled']}, live_process_full {d['live_process_full']}; "
          f"the flood's live allocations in the last reports {list(held.values())}")
    assert d["memory_throttled"] > 0 and d["live_process_full"] > 0, d
    assert all(count <= 65536 // 8 for count in held.values()), held
    assert d["live_heap_full"] == 0, d
    check_the_leaker_whole(exported, leaker)
