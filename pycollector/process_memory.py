"""This process's memory: how much is resident, and giving freed heap back to the kernel."""

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


def _find_malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _find_malloc_trim()
