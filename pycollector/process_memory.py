"""This process's memory: how much is resident, few heaps, and giving freed heap back to the kernel."""

from __future__ import annotations

import ctypes
import os


def resident_bytes(statm: str = "/proc/self/statm") -> int:
    with open(statm) as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trim_heap() -> None:
    """Give freed heap pages back to the kernel, so the resident size shows memory in use.

    glibc keeps freed memory mapped for reuse: after a burst (a large batch, BCC compiling the
    BPF program) RSS would otherwise stay at its peak. Not glibc: nothing to do.
    """
    if _malloc_trim is not None:
        _malloc_trim(0)


# glibc's mallopt parameter for the number of heaps ("arenas") threads allocate from.
_M_ARENA_MAX = -8
HEAPS = 2


def limit_heaps(heaps: int = HEAPS) -> None:
    """Let threads share ``heaps`` heaps, as MALLOC_ARENA_MAX does; call before threads start.

    glibc gives each thread that allocates at once its own heap, up to 8 per CPU, and each keeps
    the memory it freed: a gateway's gRPC threads holding requests of a few hundred KiB made the
    collector 100 MiB larger than with two heaps (bench/RESULTS.md, Pipeline), and no faster. An
    operator's MALLOC_ARENA_MAX wins. Not glibc: nothing to do."""
    if _mallopt is not None and "MALLOC_ARENA_MAX" not in os.environ:
        _mallopt(_M_ARENA_MAX, heaps)


def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


_malloc_trim = _libc_function("malloc_trim")
_mallopt = _libc_function("mallopt")
