"""The device an I/O wait waited on, by name: the ``system.device`` attribute of io_wait samples.

The kernel gives its number (bpf/off_cpu.bpf.c reads the dev_t of the file system the waiting
syscall's file is on, or of the block device a device file is). Named as the semantic
conventions' system metrics name devices (``system.disk.io``'s ``system.device``, in the 1.34.0
release the profiles' schema URL names; later releases rename it ``system.device.name``), so an
I/O wait lines up with its disk's metrics:

- a block device (major number not 0): its kernel name, as /proc/diskstats and /sys/block list
  it (``vda``, ``nvme0n1p2``, ``dm-0``), from /sys/dev/block/MAJOR:MINOR/uevent;
- a file system on no block device (major 0: NFS, FUSE, tmpfs, overlay): its mount's source as
  /proc/self/mountinfo shows it (``server:/export``), the mount source being what tells one such
  file system from another;
- neither found (a mount this agent's namespace does not see): ``MAJOR:MINOR``.

Both files are the kernel's; a mount's source is whatever its mounter wrote, kept as text of
bounded length (exporters escape what people read). Names are cached for CACHE_SECONDS: a
number is reused when a loop device or a mount goes and another comes.
"""

from __future__ import annotations

import os
import threading
import time

MINOR_BITS = 20  # the kernel's dev_t: major << 20 | minor (not glibc's makedev)
CACHE_SECONDS = 60.0
CACHE_ENTRIES = 4096  # (a host with more devices than that names some twice as often)
MAX_NAME = 256
MAX_MOUNTINFO_BYTES = 8 << 20


def major_minor(device: int) -> tuple[int, int]:
    return device >> MINOR_BITS, device & ((1 << MINOR_BITS) - 1)


class DeviceNames:
    """dev_t -> name. Called from the report thread; the lock keeps a second caller safe."""

    def __init__(self, sys_root: str = "/sys", mountinfo: str = "/proc/self/mountinfo", clock=time.monotonic):
        self._sys_root = sys_root
        self._mountinfo = mountinfo
        self._clock = clock
        self._lock = threading.Lock()
        self._names: dict[int, tuple[float, str]] = {}

    def name(self, device: int) -> str:
        now = self._clock()
        with self._lock:
            cached = self._names.get(device)
            if cached is not None and now - cached[0] < CACHE_SECONDS:
                return cached[1]
        major, minor = major_minor(device)
        name = (self._block_device(major, minor) if major else self._mount_source(major, minor)) or f"{major}:{minor}"
        with self._lock:
            if len(self._names) >= CACHE_ENTRIES:
                self._names.clear()
            self._names[device] = (now, name)
        return name

    def _block_device(self, major: int, minor: int) -> str | None:
        try:
            with open(os.path.join(self._sys_root, "dev", "block", f"{major}:{minor}", "uevent"), "rb") as stream:
                text = stream.read(4096)
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(b"DEVNAME="):
                return _text(line[len(b"DEVNAME="):])
        return None

    def _mount_source(self, major: int, minor: int) -> str | None:
        """The source of the first mount of that device in mountinfo (proc(5): "36 35 0:53 /
        /mnt rw - nfs server:/export rw,..."; fields before " - " vary in number)."""
        try:
            with open(self._mountinfo, "rb") as stream:
                text = stream.read(MAX_MOUNTINFO_BYTES)
        except OSError:
            return None
        wanted = f"{major}:{minor}".encode()
        for line in text.splitlines():
            fields = line.split(b" ")
            if len(fields) < 3 or fields[2] != wanted:
                continue
            try:
                after = fields.index(b"-", 6)
            except ValueError:
                continue
            if after + 2 < len(fields):
                return _text(_unescape(fields[after + 2]))
        return None


def _unescape(field: bytes) -> bytes:
    r"""mountinfo's octal escapes (a space is \040)."""
    if b"\\" not in field:
        return field
    out, at = bytearray(), 0
    while at < len(field):
        if field[at:at + 1] == b"\\" and field[at + 1:at + 4].isdigit():
            out.append(int(field[at + 1:at + 4], 8) & 0xFF)
            at += 4
        else:
            out.append(field[at])
            at += 1
    return bytes(out)


def _text(raw: bytes) -> str:
    return raw[:MAX_NAME].decode("utf-8", "replace")
