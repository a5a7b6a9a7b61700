"""The Python heap sampler's workload (tests/test_memory_profiling.py), run with
PYCOLLECTOR_HEAP_SAMPLE_BYTES set where pycollector-otel-context is installed (sdk/python,
pycollector_heap): two Python functions allocate objects 3:1 by bytes (allocate_big: 12 KiB
objects, which pymalloc passes on to PyMem_RawMalloc; allocate_small: 384-byte ones, which
pymalloc serves from its arenas) and keep a few alive at a time; a third fills a cache that
grows and stays. Each object is one bytes object whose size as allocated sys.getsizeof gives
(the header and the bytes), so the bytes each function asked for are counted here, not guessed.

It spins until SIGUSR1, allocates, prints "bytes FUNCTION N" for the three functions and "leaked
N" (what the cache holds), spins until SIGUSR2 and exits (phases.py). It prints "ready" once its
signals are handled."""

import sys
from itertools import repeat

from phases import ready, spin_until

HEADER = sys.getsizeof(b"")  # a bytes object's header and terminating byte
BIG, SMALL, CACHED = 12 * 1024, 384, 8 * 1024  # bytes each object takes, header included
# Their lengths, computed once: an int made per object would be allocated in the functions too.
BIG_LENGTH, SMALL_LENGTH, CACHED_LENGTH = BIG - HEADER, SMALL - HEADER, CACHED - HEADER
ROUNDS = 16
CACHE = []


def allocate_big(count):
    kept = []
    for _ in repeat(None, count):  # (repeat: no int object per iteration)
        kept.append(bytes(BIG_LENGTH))
        if len(kept) > 8:
            del kept[0]
    return count * BIG


def allocate_small(count):
    kept = []
    for _ in repeat(None, count):
        kept.append(bytes(SMALL_LENGTH))
        if len(kept) > 8:
            del kept[0]
    return count * SMALL


def grow_cache(count):
    for _ in repeat(None, count):
        CACHE.append(bytes(CACHED_LENGTH))
    return count * CACHED


ready()
spin_until(1)
big = small = cached = 0
for _ in range(ROUNDS):
    big += allocate_big(256)  # 3 MiB a round
    small += allocate_small(2731)  # 1 MiB
    cached += grow_cache(128)  # 1 MiB, kept
held = sys.getsizeof(CACHE) + sum(sys.getsizeof(value) for value in CACHE)
print(f"bytes allocate_big {big}\nbytes allocate_small {small}\nbytes grow_cache {cached}\nleaked {held}", flush=True)
spin_until(2)
