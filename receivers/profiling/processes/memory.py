"""Another process's memory, read through /proc/PID/mem.

One descriptor per process, read with pread: no ptrace stop, so the process runs on while its
structures are read (they may change under the reader; callers check what they read). Reading
needs the same rights as ptrace-attaching (root, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import os
import struct

USER_SPACE_END = 1 << 63  # x86-64 user space ends at 2**47 (2**56 with 5-level paging)
MAX_READ_BYTES = 1 << 20  # the largest structure read: a code object's line table, its name

_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")


class MemoryReadError(OSError):
    """A read of another process's memory failed: the address is not mapped (EIO), the process
    is gone (ESRCH, or a short read), or reading it is not allowed (EACCES, EPERM)."""

    def __init__(self, pid: int, address: int, size: int, reason: str, errno: int | None = None):
        super().__init__(errno, f"reading {size} bytes at 0x{address:x} in process {pid}: {reason}")
        self.pid, self.address, self.size = pid, address, size


class ProcessMemory:
    """Reads of process ``pid``'s memory. Use as a context manager, or close()."""

    def __init__(self, pid: int, proc: str = "/proc"):
        self.pid = pid
        try:
            self._fd = os.open(f"{proc}/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise MemoryReadError(pid, 0, 0, f"cannot open its memory: {e.strerror}", e.errno) from e

    def read(self, address: int, size: int) -> bytes:
        # Addresses and sizes are read from the process itself: garbage in an exiting process,
        # anything at all in a hostile one. Past 2**63 pread's offset overflows (OverflowError
        # cost short-lived processes whole reports); a size of gigabytes would be allocated.
        if address <= 0 or size < 0 or address + size > USER_SPACE_END:
            raise MemoryReadError(self.pid, address, size, "not a user-space address")
        if size > MAX_READ_BYTES:
            raise MemoryReadError(self.pid, address, size, f"larger than one read may be ({MAX_READ_BYTES} bytes)")
        try:
            data = os.pread(self._fd, size, address)
        except OSError as e:
            raise MemoryReadError(self.pid, address, size, e.strerror or str(e), e.errno) from e
        if len(data) != size:
            raise MemoryReadError(self.pid, address, size, f"only {len(data)} bytes readable")
        return data

    def u64(self, address: int) -> int:
        return _U64.unpack(self.read(address, 8))[0]

    def u32(self, address: int) -> int:
        return _U32.unpack(self.read(address, 4))[0]

    def i32(self, address: int) -> int:
        return _I32.unpack(self.read(address, 4))[0]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ProcessMemory:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # Readers shared between threads are let go rather than closed: a closed descriptor's
        # number may be reused by another process's reader while a thread still reads through it.
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
