"""The BPF system calls the agent makes once its program is compiled, through BCC's libbcc_bpf.

libbcc_bpf is BCC's own wrapper of the bpf() and perf_event_open() calls and its perf buffer reader,
the same functions BCC's Python module calls, in a library without LLVM: loading it costs 3 MiB
resident where libbcc (which pulls in clang and LLVM) costs 64. Only the compiler child
(compiler.py) loads libbcc. Where a distribution ships libbcc alone, the same functions are read
from it.
"""

from __future__ import annotations

import ctypes as ct
import functools

RAW_CALLBACK = ct.CFUNCTYPE(None, ct.py_object, ct.c_void_p, ct.c_int)  # (cookie, data, size)
LOST_CALLBACK = ct.CFUNCTYPE(None, ct.py_object, ct.c_ulonglong)  # (cookie, lost)


class PerfBufferOptions(ct.Structure):
    _fields_ = [("pid", ct.c_int), ("cpu", ct.c_int), ("wakeup_events", ct.c_int)]


_SIGNATURES = {
    # name: (restype, argtypes), as libbpf.h of BCC declares them
    "bcc_create_map": (ct.c_int, [ct.c_int, ct.c_char_p, ct.c_int, ct.c_int, ct.c_int, ct.c_int]),
    "bcc_prog_load": (ct.c_int, [ct.c_int, ct.c_char_p, ct.c_void_p, ct.c_int, ct.c_char_p, ct.c_uint,
                                 ct.c_int, ct.c_char_p, ct.c_uint]),
    "bpf_lookup_elem": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p]),
    "bpf_update_elem": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_ulonglong]),
    "bpf_delete_elem": (ct.c_int, [ct.c_int, ct.c_void_p]),
    "bpf_get_first_key": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_uint]),
    "bpf_get_next_key": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p]),
    "bpf_update_batch": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.POINTER(ct.c_uint32)]),
    "bpf_lookup_batch": (ct.c_int, [ct.c_int, ct.POINTER(ct.c_uint32), ct.POINTER(ct.c_uint32), ct.c_void_p,
                                    ct.c_void_p, ct.c_void_p]),
    "bpf_lookup_and_delete_batch": (ct.c_int, [ct.c_int, ct.POINTER(ct.c_uint32), ct.POINTER(ct.c_uint32),
                                               ct.c_void_p, ct.c_void_p, ct.c_void_p]),
    "bpf_attach_perf_event": (ct.c_int, [ct.c_int, ct.c_uint32, ct.c_uint32, ct.c_uint64, ct.c_uint64, ct.c_int,
                                         ct.c_int, ct.c_int]),
    "bpf_close_perf_event_fd": (ct.c_int, [ct.c_int]),
    "bpf_attach_raw_tracepoint": (ct.c_int, [ct.c_int, ct.c_char_p]),
    "bpf_open_perf_buffer_opts": (ct.c_void_p, [RAW_CALLBACK, LOST_CALLBACK, ct.py_object, ct.c_int,
                                                ct.POINTER(PerfBufferOptions)]),
    "perf_reader_poll": (ct.c_int, [ct.c_int, ct.POINTER(ct.c_void_p), ct.c_int]),
    "perf_reader_consume": (ct.c_int, [ct.c_int, ct.POINTER(ct.c_void_p)]),
    "perf_reader_free": (None, [ct.c_void_p]),
    "perf_reader_fd": (ct.c_int, [ct.c_void_p]),
}


@functools.cache
def lib() -> ct.CDLL:
    """libbcc_bpf with the signatures above (its own handle: BCC's module's is left as it is)."""
    for name in ("libbcc_bpf.so.0", "libbcc.so.0"):
        try:
            library = ct.CDLL(name, use_errno=True)
        except OSError:
            continue
        for function, (restype, argtypes) in _SIGNATURES.items():
            getattr(library, function).restype = restype
            getattr(library, function).argtypes = argtypes
        return library
    raise OSError("neither libbcc_bpf.so.0 nor libbcc.so.0 could be loaded: install BCC "
                  "(Debian/Ubuntu: `apt-get install libbpfcc python3-bpfcc`)")


def cpus(kind: str) -> list[int]:
    """The CPUs the kernel lists as ``kind`` ("online" or "possible"), e.g. "0-3,6"."""
    with open(f"/sys/devices/system/cpu/{kind}") as f:
        text = f.read().strip()
    found: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found
