"""The memory profiler's Python workload (tests/test_memory_profiling.py), run under the native
heap sampler: two Python functions allocate 3:1 by bytes (bytearrays of 12 KiB and 4 KiB, each
one malloc of its size + 1), keeping a few alive at a time. It spins until SIGUSR1 (so the
profiler sees it on a CPU, attaches to its probes and finds its interpreter), allocates, prints
the bytes each function asked for, spins until SIGUSR2 and exits (phases.py). It prints "ready" once
its signals are handled."""

from phases import ready, spin_until


def allocate_big(rounds):
    kept = []
    for _ in range(rounds):
        kept.append(bytearray(3 * 4096))
        if len(kept) > 8:
            kept.pop(0)
    return rounds * (3 * 4096 + 1)


def allocate_small(rounds):
    kept = []
    for _ in range(rounds):
        kept.append(bytearray(4096))
        if len(kept) > 8:
            kept.pop(0)
    return rounds * (4096 + 1)


ready()
spin_until(1)
big = small = 0
for _ in range(20):
    big += allocate_big(400)
    small += allocate_small(400)
print(f"bytes allocate_big {big}\nbytes allocate_small {small}", flush=True)
spin_until(2)
