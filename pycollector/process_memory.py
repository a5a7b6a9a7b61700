"""This process's memory: how much is resident, few heaps, and giving freed heap back to the kernel."""

from __future__ import annotations

import ctypes
import os


def resident_bytes(statm: str = "/proc/self/statm") -> int:
    with open(statm) as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trim_heap() -> None:
    """Give freed heap pages back to the kernel, so the resident size shows memory in use.

    glibc keeps freed memory mapped for reuse: after a burst (a large batch, the profiler's
    start) RSS would otherwise stay at its peak. Not glibc: nothing to do.
    """
    if _malloc_trim is not None:
        _malloc_trim(0)


# glibc's mallopt parameters: the number of heaps ("arenas") threads allocate from, and the size
# from which a block gets pages of its own (returned to the kernel when freed).
_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3
HEAPS = 2
MMAP_THRESHOLD = 1 << 20


def limit_heaps(heaps: int = HEAPS) -> None:
    """Let threads share ``heaps`` heaps, as MALLOC_ARENA_MAX does, and give blocks of a MiB or
    more pages of their own; call before threads start.

    glibc gives each thread that allocates at once its own heap, up to 8 per CPU, and each keeps
    the memory it freed: a gateway's gRPC threads holding requests of a few hundred KiB made the
    collector 100 MiB larger than with two heaps (bench/RESULTS.md, Pipeline), and no faster.
    glibc also raises its mmap threshold to the largest block freed (up to 32 MiB), so a
    gateway's batches of a few MiB came from the heap and stayed there: a fixed threshold of
    1 MiB took the collector's RSS after the bench's stream from 68 to 37 MiB above idle (256 KiB
    took it to 32 and cost 17% of the throughput; 1 MiB is within the noise of it). An operator's
    MALLOC_ARENA_MAX and MALLOC_MMAP_THRESHOLD_ (or GLIBC_TUNABLES) win. Not glibc: nothing to do."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if _mallopt is not None and "MALLOC_ARENA_MAX" not in os.environ and "glibc.malloc.arena_max" not in tunables:
        _mallopt(_M_ARENA_MAX, heaps)
    if _mallopt is not None and "MALLOC_MMAP_THRESHOLD_" not in os.environ and "glibc.malloc.mmap_threshold" not in tunables:
        _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


_malloc_trim = _libc_function("malloc_trim")
_mallopt = _libc_function("mallopt")
