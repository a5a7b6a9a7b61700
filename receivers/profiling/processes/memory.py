"""Another process's memory, read through /proc/PID/mem.

One descriptor per process, read with pread: no ptrace stop, so the process runs on while its
structures are read (they may change under the reader; callers check what they read). Reading
needs the same rights as ptrace-attaching (root, or CAP_SYS_PTRACE).

A read faults in the pages it covers, in the process's memory, as the process would: a page of a
file mapping comes from that file's file system. A process can map a file of a FUSE file system
it serves itself and point the reader there (a code object, a context's payload), then stop
answering: the fault, and the reading thread, would wait for ever. So before a read, the pages'
entries in /proc/PID/pagemap (which reading does not fault in) say whether they are in memory or
swap; if one is not, the read goes ahead only when no FUSE file is mapped there (the process's
maps, and its mount table for the file system of each file).

A process that has exited has no memory left to read, and says so (``ProcessExited``, and
``exited`` from then on): a read of its memory or of its page map gives nothing at all (the
descriptors hold its memory until its last user is gone; an address not mapped is an error
instead). A report often names the last samples of a process after it is gone, and its namers
then use what they read while it ran rather than spend their budgets on reads that fail.
"""

from __future__ import annotations

import os
import struct
import threading
import time

USER_SPACE_END = 1 << 63  # x86-64 user space ends at 2**47 (2**56 with 5-level paging)
MAX_READ_BYTES = 1 << 20  # the largest structure read: a code object's line table, its name

_PAGE_SHIFT = os.sysconf("SC_PAGE_SIZE").bit_length() - 1
_IN_MEMORY_OR_SWAP = 3 << 62  # pagemap: bit 63 present, bit 62 swapped
_PRESENT = 1 << 63
_MAX_MOUNTINFO_BYTES = 4 << 20
# The slow check (the process's maps, then the mount tables) reads what the process controls: its
# maps at most this much (about 40,000 mappings; a process with more has its pages that are not
# in memory left unread), and at most SLOW_CHECKS_PER_S times a second per process (a forged
# object pointing at pages not in memory, asked of every frame, made every read re-read them).
_MAX_MAPS_BYTES = 4 << 20
SLOW_CHECKS_PER_S = 8.0

# The slow checks of all readers, published as the receiver's process_memory_<name>.
stats = {"slow_checks": 0, "slow_checks_refused": 0}
_stats_lock = threading.Lock()

_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")


class MemoryReadError(OSError):
    """A read of another process's memory failed: the address is not mapped (EIO), the process
    is gone (ESRCH, or a short read), or reading it is not allowed (EACCES, EPERM)."""

    def __init__(self, pid: int, address: int, size: int, reason: str, errno: int | None = None):
        super().__init__(errno, f"reading {size} bytes at 0x{address:x} in process {pid}: {reason}")
        self.pid, self.address, self.size = pid, address, size


class ProcessExited(MemoryReadError):
    """The process has exited (or is exiting): none of its memory is left."""

    def __init__(self, pid: int, address: int, size: int):
        super().__init__(pid, address, size, "the process has exited")


class ProcessMemory:
    """Reads of process ``pid``'s memory. Use as a context manager, or close()."""

    def __init__(self, pid: int, proc: str = "/proc"):
        self.pid = pid
        self._proc = proc
        self._fd = self._pagemap = -1
        try:
            self._fd = os.open(f"{proc}/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            self._pagemap = os.open(f"{proc}/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            self.close()
            raise MemoryReadError(pid, 0, 0, f"cannot open its memory: {e.strerror}", e.errno) from e
        self.exited = False
        # Whether the last read touched a page not in memory (in swap, or not faulted in yet):
        # it may have waited for a disk.
        self.waited = False
        # Slow checks it may still make (a bucket refilled at SLOW_CHECKS_PER_S), and when it was.
        self._slow_checks, self._slow_checks_at = SLOW_CHECKS_PER_S, time.monotonic()

    def read(self, address: int, size: int) -> bytes:
        # Addresses and sizes are read from the process itself: garbage in an exiting process,
        # anything at all in a hostile one. Past 2**63 pread's offset overflows (OverflowError
        # cost short-lived processes whole reports); a size of gigabytes would be allocated.
        if address <= 0 or size < 0 or address + size > USER_SPACE_END:
            raise MemoryReadError(self.pid, address, size, "not a user-space address")
        if size > MAX_READ_BYTES:
            raise MemoryReadError(self.pid, address, size, f"larger than one read may be ({MAX_READ_BYTES} bytes)")
        if self.exited:
            raise ProcessExited(self.pid, address, size)
        self.waited = False
        if size and not self._safe_to_fault(address, size):
            raise MemoryReadError(self.pid, address, size, "a page of a FUSE file that is not in memory: reading it "
                                  "would wait for that file system's daemon")
        try:
            data = os.pread(self._fd, size, address)
        except OSError as e:
            raise MemoryReadError(self.pid, address, size, e.strerror or str(e), e.errno) from e
        if not data and size and self._gone():  # (an address not mapped fails with EIO)
            raise ProcessExited(self.pid, address, size)
        if len(data) != size:
            raise MemoryReadError(self.pid, address, size, f"only {len(data)} bytes readable")
        return data

    def _safe_to_fault(self, address: int, size: int) -> bool:
        """Whether reading [address, address + size) can fault in nothing from a FUSE file."""
        first, last = address >> _PAGE_SHIFT, (address + size - 1) >> _PAGE_SHIFT
        try:
            entries = os.pread(self._pagemap, 8 * (last - first + 1), 8 * first)
        except OSError:
            return False
        if not entries and self._gone():
            raise ProcessExited(self.pid, address, size)
        pages = [entry for (entry,) in _U64.iter_unpack(entries)]
        self.waited = not all(entry & _PRESENT for entry in pages)
        if len(pages) == last - first + 1 and all(entry & _IN_MEMORY_OR_SWAP for entry in pages):
            return True  # (the common case: what a process uses is in memory)
        if not self._take_slow_check():
            return False
        return not self._maps_fuse_file(address, address + size)

    def _take_slow_check(self) -> bool:
        now = time.monotonic()
        self._slow_checks = min(SLOW_CHECKS_PER_S, self._slow_checks + (now - self._slow_checks_at) * SLOW_CHECKS_PER_S)
        self._slow_checks_at = now
        taken = self._slow_checks >= 1
        if taken:
            self._slow_checks -= 1
        with _stats_lock:
            stats["slow_checks" if taken else "slow_checks_refused"] += 1
        return taken

    def _gone(self) -> bool:
        """Whether the process's memory is gone: its page map gives nothing even for the first
        page (beyond the top of user space it gives nothing for a live process too)."""
        try:
            self.exited = os.pread(self._pagemap, 8, 0) == b""
        except OSError:
            return False
        return self.exited

    def _maps_fuse_file(self, start: int, end: int) -> bool:
        """Whether a FUSE file (or a mapping that could not be told) is mapped in [start, end)."""
        try:
            with open(f"{self._proc}/{self.pid}/maps", "rb") as maps:
                text = maps.read(_MAX_MAPS_BYTES + 1)
        except OSError:
            return True
        if not text or len(text) > _MAX_MAPS_BYTES:
            # A zombie, or a live process whose first thread exited (its threads run on, but
            # maps shows nothing): not to be told apart here, so nothing is read. Nor past the
            # bound, where the mapping may be.
            return True
        devices = set()
        for line in text.splitlines():
            fields = line.split(None, 5)
            low, _, high = fields[0].partition(b"-")
            if int(high, 16) <= start or int(low, 16) >= end or fields[4] == b"0":
                continue  # elsewhere, or anonymous (a fault gives it zeroes or takes it from swap)
            devices.add(fields[3].decode())
        if not devices:
            return False
        file_systems = self._file_systems(devices)
        return any(_is_fuse(file_systems.get(device, "?")) for device in devices)

    def _file_systems(self, devices: set[str]) -> dict[str, str]:
        """The type of the file system on each of ``devices`` ("fd:01", as maps writes them),
        from the process's mount table, else the agent's (an overlay's lower layer shows its own
        device); a device neither has is left out. Read afresh each time: a device number of an
        unmounted file system is given to the next one mounted (FUSE's are anonymous: 0:N)."""
        wanted = {":".join(str(int(part, 16)) for part in device.split(":")): device for device in devices}  # mountinfo: decimal
        found: dict[str, str] = {}
        for table in (f"{self._proc}/{self.pid}/mountinfo", f"{self._proc}/self/mountinfo"):
            if len(found) == len(wanted):
                break
            try:
                with open(table, "rb") as mountinfo:
                    for line in mountinfo.read(_MAX_MOUNTINFO_BYTES).splitlines():
                        head, _, tail = line.partition(b" - ")
                        fields = head.split()
                        if len(fields) > 2 and tail and (device := wanted.get(fields[2].decode())) is not None:
                            found.setdefault(device, tail.split()[0].decode("utf-8", "replace"))
            except OSError:
                continue
        return found

    def u64(self, address: int) -> int:
        return _U64.unpack(self.read(address, 8))[0]

    def u32(self, address: int) -> int:
        return _U32.unpack(self.read(address, 4))[0]

    def i32(self, address: int) -> int:
        return _I32.unpack(self.read(address, 4))[0]

    def close(self) -> None:
        for name in ("_fd", "_pagemap"):
            if getattr(self, name, -1) >= 0:
                os.close(getattr(self, name))
                setattr(self, name, -1)

    def __enter__(self) -> ProcessMemory:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # Readers shared between threads are let go rather than closed: a closed descriptor's
        # number may be reused by another process's reader while a thread still reads through it.
        for name in ("_fd", "_pagemap"):
            if getattr(self, name, -1) >= 0:
                os.close(getattr(self, name))


def _is_fuse(file_system: str) -> bool:
    return file_system in ("fuse", "fuseblk", "?") or file_system.startswith("fuse.")
