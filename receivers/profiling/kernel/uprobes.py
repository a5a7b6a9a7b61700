"""A BPF program on one process's USDT probes, with each probe's semaphore raised while attached.

BCC's attach_uprobe (0.26) has no ``ref_ctr_offset``, and without it a probe guarded by a
semaphore (``_SDT_HAS_SEMAPHORES``: the memory profiling contract's otel_memory:alloc and :free)
never fires: the program tests the counter before it reaches the probe. So the probes are attached
here, in one of two ways:

- ``attach_multi``: a BPF uprobe_multi link (Linux 6.6+), all the probes of one file in one
  process at once: BPF_LINK_CREATE with BPF_TRACE_UPROBE_MULTI, the file's path, the probes' file
  offsets and their semaphores' (``ref_ctr_offsets``), and the process's pid (the kernel runs the
  program only in that process, and raises only its counters). The program must have been loaded
  with that expected attach type. This needs CAP_BPF and CAP_PERFMON only: what the systemd unit
  and the DaemonSet grant.
- ``attach``: a perf event of the kernel's uprobe PMU, one per probe, for kernels without
  uprobe_multi. Since Linux 6.16 (and its stable backports: "perf: Revert to requiring
  CAP_SYS_ADMIN for uprobes") the PMU wants CAP_SYS_ADMIN, which the deployments do not grant.
  It is opened as libbpf opens it: ``perf_event_open`` with the uprobe PMU's type (from sysfs),
``config1`` the path of the file, ``config2`` the probe's file offset and the semaphore's file
offset in ``config`` bits 32-63 (PERF_UPROBE_REF_CTR_OFFSET_SHIFT); pid-scoped, so only that
process's threads run it (the kernel filters by the process's mm) and only its counter is raised
(the kernel increments it in that process's memory while the event is open, and decrements it on
close). Then PERF_EVENT_IOC_SET_BPF and PERF_EVENT_IOC_ENABLE; closing the descriptor detaches.

The path: the kernel resolves it as the agent, at the open, and attaches to the inode it finds.
A sampled process's paths are its own to choose (a symlink, a file replaced in between), so the
kernel is given none of them: the caller opens the file through the hardened helper
(processes/files.open_mapped_file: /proc/PID/map_files, the inode checked against the mapping, as
the process's credentials) and passes that descriptor; the kernel is given /proc/self/fd/N, which
names exactly the inode that was checked and read, whatever the process does to its paths.
"""

from __future__ import annotations

import ctypes as ct
import errno
import fcntl
import os
import platform
import struct

UPROBE_TYPE_FILE = "/sys/bus/event_source/devices/uprobe/type"
PERF_UPROBE_REF_CTR_OFFSET_SHIFT = 32  # include/uapi/linux/perf_event.h (kernel/trace/trace_event_perf.c reads it)
_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE = 0x2400  # _IO('$', 0)
PERF_EVENT_IOC_DISABLE = 0x2401  # _IO('$', 1)
PERF_EVENT_IOC_SET_BPF = 0x40042408  # _IOW('$', 8, __u32)
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
BPF_PROG_LOAD, BPF_LINK_CREATE = 5, 28
BPF_PROG_TYPE_KPROBE = 2
BPF_TRACE_UPROBE_MULTI = 48  # enum bpf_attach_type (Linux 6.6+)
BPF_ATTR_BYTES = 144  # more than either command reads; the rest zero
MAX_UPROBE_MULTI = 64  # probes in one link here (the kernel takes up to MAX_UPROBE_MULTI_CNT, 1M)
# The semaphore's offset must fit in config's upper 32 bits.
MAX_REF_CTR_OFFSET = (1 << 32) - 1

_libc = ct.CDLL(None, use_errno=True)


class PerfEventAttr(ct.Structure):
    """struct perf_event_attr up to config3 (PERF_ATTR_SIZE_VER8, 136 bytes)."""

    _fields_ = [
        ("type", ct.c_uint32), ("size", ct.c_uint32), ("config", ct.c_uint64), ("sample_period", ct.c_uint64),
        ("sample_type", ct.c_uint64), ("read_format", ct.c_uint64), ("flags", ct.c_uint64), ("wakeup_events", ct.c_uint32),
        ("bp_type", ct.c_uint32), ("config1", ct.c_uint64), ("config2", ct.c_uint64), ("branch_sample_type", ct.c_uint64),
        ("sample_regs_user", ct.c_uint64), ("sample_stack_user", ct.c_uint32), ("clockid", ct.c_int32),
        ("sample_regs_intr", ct.c_uint64), ("aux_watermark", ct.c_uint32), ("sample_max_stack", ct.c_uint16),
        ("reserved_2", ct.c_uint16), ("aux_sample_size", ct.c_uint32), ("reserved_3", ct.c_uint32), ("sig_data", ct.c_uint64),
        ("config3", ct.c_uint64),
    ]


class UprobeError(OSError):
    """The kernel refused the uprobe; ``errno`` is its reason."""


_pmu_type: int | None = None


def uprobe_pmu_type() -> int:
    """The uprobe PMU's perf type (dynamic: the kernel numbers PMUs as they register)."""
    global _pmu_type
    if _pmu_type is None:
        try:
            with open(UPROBE_TYPE_FILE) as f:
                _pmu_type = int(f.read().strip())
        except (OSError, ValueError) as error:
            raise UprobeError(errno.ENOENT, f"no uprobe PMU ({UPROBE_TYPE_FILE}: {error}); uprobes need CONFIG_UPROBE_EVENTS") from None
    return _pmu_type


def attach(program_fd: int, file_fd: int, offset: int, ref_ctr_offset: int, pid: int) -> int:
    """Run ``program_fd`` (a BPF_PROG_TYPE_KPROBE program) when process ``pid`` reaches file
    offset ``offset`` of the file open on ``file_fd``, raising its semaphore at file offset
    ``ref_ctr_offset`` (0: none) while attached. Returns the perf event's descriptor: close it
    (detach()) to detach. Raises UprobeError with the kernel's errno."""
    if _SYS_PERF_EVENT_OPEN is None:
        raise UprobeError(errno.ENOSYS, f"perf_event_open's system call number on {platform.machine()} is not known here")
    if not 0 <= ref_ctr_offset <= MAX_REF_CTR_OFFSET:
        raise UprobeError(errno.EINVAL, f"semaphore offset {ref_ctr_offset:#x} does not fit the uprobe's config")
    path = f"/proc/self/fd/{file_fd}".encode()
    name = ct.create_string_buffer(path)
    attr = PerfEventAttr()
    attr.size = ct.sizeof(PerfEventAttr)
    attr.type = uprobe_pmu_type()
    attr.config = ref_ctr_offset << PERF_UPROBE_REF_CTR_OFFSET_SHIFT
    attr.config1 = ct.addressof(name)
    attr.config2 = offset
    fd = _libc.syscall(_SYS_PERF_EVENT_OPEN, ct.byref(attr), ct.c_int(pid), ct.c_int(-1), ct.c_int(-1),
                       ct.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        code = ct.get_errno()
        raise UprobeError(code, f"uprobe at offset {offset:#x} in pid {pid}: {os.strerror(code)}")
    try:
        fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, program_fd)
        fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
    except OSError as error:
        os.close(fd)
        raise UprobeError(error.errno, f"uprobe at offset {offset:#x} in pid {pid}: {error.strerror}") from None
    return fd


def detach(fd: int) -> None:
    """Disable and close a uprobe attach() opened (the kernel lowers the semaphore as it goes)."""
    try:
        fcntl.ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
    except OSError:
        pass  # (closing detaches all the same)
    os.close(fd)


def _bpf(command: int, attr) -> int:
    if _SYS_BPF is None:
        raise UprobeError(errno.ENOSYS, f"bpf's system call number on {platform.machine()} is not known here")
    return _libc.syscall(_SYS_BPF, ct.c_int(command), attr, ct.c_uint(BPF_ATTR_BYTES))


def load_program(instructions: bytes, license: str, kern_version: int, name: str, log_level: int = 0,
                 expected_attach_type: int = BPF_TRACE_UPROBE_MULTI) -> tuple[int, str]:
    """A BPF_PROG_TYPE_KPROBE program loaded with ``expected_attach_type`` (which libbcc_bpf's
    bcc_prog_load cannot set): (its descriptor or -errno, what the verifier printed)."""
    code = ct.create_string_buffer(instructions, len(instructions))
    licence = ct.create_string_buffer(license.encode())
    log = ct.create_string_buffer(1 << 20) if log_level else None
    attr = ct.create_string_buffer(BPF_ATTR_BYTES)
    # union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level, log_size,
    # log_buf, kern_version, prog_flags, prog_name[16], prog_ifindex, expected_attach_type
    struct.pack_into("<IIQQIIQII16sII", attr, 0, BPF_PROG_TYPE_KPROBE, len(instructions) // 8, ct.addressof(code), ct.addressof(licence),
                     log_level, len(log) if log is not None else 0, ct.addressof(log) if log is not None else 0, kern_version, 0,
                     name.encode()[:15], 0, expected_attach_type)
    fd = _bpf(BPF_PROG_LOAD, attr)
    failed = ct.get_errno() if fd < 0 else 0
    text = log.value.decode("utf-8", "replace") if log is not None else ""
    if failed and not log_level:  # (load again for the verifier's reason)
        log = ct.create_string_buffer(1 << 20)
        struct.pack_into("<IIQ", attr, 24, 1, len(log), ct.addressof(log))
        _bpf(BPF_PROG_LOAD, attr)
        text = log.value.decode("utf-8", "replace")
    return (fd if fd >= 0 else -failed), text


def multi_supported() -> bool:
    """Whether this kernel has uprobe_multi links (a program loads with that attach type)."""
    fd, _ = load_program(bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0]), "GPL", 0, "uprobe_multi_ok")
    if fd < 0:
        return False
    os.close(fd)
    return True


def attach_multi(program_fd: int, file_fd: int, offsets: list[int], ref_ctr_offsets: list[int], pid: int) -> int:
    """Run ``program_fd`` (loaded by load_program) when process ``pid`` reaches any of ``offsets``
    of the file open on ``file_fd``, raising the semaphore at the matching ``ref_ctr_offsets``
    (0: none) while attached. Returns the link's descriptor: close it (detach_multi) to detach.
    Raises UprobeError with the kernel's errno."""
    if not 0 < len(offsets) == len(ref_ctr_offsets) <= MAX_UPROBE_MULTI:
        raise UprobeError(errno.EINVAL, f"{len(offsets)} probes for one link")
    path = ct.create_string_buffer(f"/proc/self/fd/{file_fd}".encode())
    places = (ct.c_uint64 * len(offsets))(*offsets)
    counters = (ct.c_uint64 * len(offsets))(*ref_ctr_offsets)
    attr = ct.create_string_buffer(BPF_ATTR_BYTES)
    # link_create: prog_fd, target_fd, attach_type, flags, then uprobe_multi: path, offsets,
    # ref_ctr_offsets, cookies, cnt, flags, pid
    struct.pack_into("<IIIIQQQQIII", attr, 0, program_fd, 0, BPF_TRACE_UPROBE_MULTI, 0, ct.addressof(path), ct.addressof(places),
                     ct.addressof(counters), 0, len(offsets), 0, pid)
    fd = _bpf(BPF_LINK_CREATE, attr)
    if fd < 0:
        code = ct.get_errno()
        raise UprobeError(code, f"uprobe_multi link of {len(offsets)} probes in pid {pid}: {os.strerror(code)}")
    return fd


def detach_multi(fd: int) -> None:
    """Close a link attach_multi() made (the kernel lowers the semaphores as it goes)."""
    os.close(fd)
