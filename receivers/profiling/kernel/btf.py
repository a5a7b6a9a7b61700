"""Offsets of kernel struct members, from the running kernel's BTF (/sys/kernel/btf/vmlinux).

BCC compiles against the kernel headers it finds, which may be another version's (Debian's 6.1
headers on a 6.18 kernel): a field reached through them can sit elsewhere in the running kernel.
The few offsets the BPF program needs that way come from BTF, which describes the kernel that
runs. The format is the kernel's documented one (Documentation/bpf/btf.rst): a header, then type
records whose size depends on their kind, then the strings.
"""

from __future__ import annotations

import functools
import struct

VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
_MAGIC = 0xEB9F
_HEADER = struct.Struct("<HBBIIIII")
_TYPE = struct.Struct("<III")
_MEMBER = struct.Struct("<III")
KIND_STRUCT, KIND_UNION = 4, 5
_QUALIFIERS = {8, 9, 10, 11, 18}  # typedef, volatile, const, restrict, type tag: see through
# Bytes after the common 12 of a type record: fixed, or per member (vlen of them).
_FIXED_EXTRA = {1: 4, 3: 12, 14: 4, 17: 4}
_PER_MEMBER = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}


class BtfError(ValueError):
    """No BTF, or it does not describe the member asked for."""


class Btf:
    def __init__(self, data: bytes) -> None:
        if len(data) < _HEADER.size:
            raise BtfError("BTF data too short")
        magic, _version, _flags, header_length, type_offset, type_length, string_offset, string_length = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise BtfError(f"not BTF (magic {magic:#x})")
        self._data = data
        self._strings = header_length + string_offset
        self._strings_end = self._strings + string_length
        self._types: list[int] = [0]  # offset of each type record; id 0 is void
        self._by_name: dict[str, int] = {}
        position, end = header_length + type_offset, header_length + type_offset + type_length
        while position < end:
            type_id = len(self._types)
            self._types.append(position)
            name_offset, info, _ = _TYPE.unpack_from(data, position)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            if kind in (KIND_STRUCT, KIND_UNION) and name_offset:
                self._by_name.setdefault(self._string(name_offset), type_id)
            position += _TYPE.size + _FIXED_EXTRA.get(kind, 0) + vlen * _PER_MEMBER.get(kind, 0)

    @classmethod
    def of_running_kernel(cls, path: str = VMLINUX_BTF) -> Btf:
        try:
            with open(path, "rb") as stream:
                return cls(stream.read())
        except OSError as error:
            raise BtfError(f"cannot read the kernel's BTF ({path}): {error.strerror}") from None

    def _string(self, offset: int) -> str:
        start = self._strings + offset
        return self._data[start:self._data.index(b"\0", start, self._strings_end)].decode()

    def _resolve(self, type_id: int) -> int:
        for _ in range(16):  # qualifiers and typedefs nest shallowly
            name_offset, info, referenced = _TYPE.unpack_from(self._data, self._types[type_id])
            if (info >> 24) & 0x1F not in _QUALIFIERS:
                return type_id
            type_id = referenced
        return type_id

    def member_offset(self, struct_name: str, path: str) -> int:
        """Byte offset of ``path`` (e.g. "thread.fsbase") in ``struct struct_name``, following
        nested structs and anonymous unions."""
        type_id = self._by_name.get(struct_name)
        if type_id is None:
            raise BtfError(f"the kernel's BTF has no struct {struct_name}")
        offset = 0
        for name in path.split("."):
            found = self._find_member(type_id, name)
            if found is None:
                raise BtfError(f"struct {struct_name} has no member {path}")
            member_type, bits = found
            offset += bits // 8
            type_id = self._resolve(member_type)
        return offset

    def _find_member(self, type_id: int, name: str) -> tuple[int, int] | None:
        """(type id, bit offset) of member ``name``, looking inside anonymous members."""
        position = self._types[type_id]
        _, info, _ = _TYPE.unpack_from(self._data, position)
        kind, vlen, bitfields = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        if kind not in (KIND_STRUCT, KIND_UNION):
            return None
        for index in range(vlen):
            name_offset, member_type, offset = _MEMBER.unpack_from(self._data, position + _TYPE.size + index * _MEMBER.size)
            bits = offset & 0xFFFFFF if bitfields else offset
            if name_offset and self._string(name_offset) == name:
                return member_type, bits
            if not name_offset:  # an anonymous struct or union: its members are this one's
                inner = self._find_member(self._resolve(member_type), name)
                if inner is not None:
                    return inner[0], bits + inner[1]
        return None


# The members an I/O wait's device is read through (bpf/off_cpu.bpf.c io_device), as the cflag
# that carries each offset: the thread's file table, a descriptor's file, its inode, its file
# system's device (or a device file's own).
FILE_DEVICE_MEMBERS = (
    ("TASK_FILES_OFFSET", "task_struct", "files"),
    ("FILES_FDT_OFFSET", "files_struct", "fdt"),
    ("FDTABLE_MAX_FDS_OFFSET", "fdtable", "max_fds"),
    ("FDTABLE_FD_OFFSET", "fdtable", "fd"),
    ("FILE_INODE_OFFSET", "file", "f_inode"),
    ("INODE_MODE_OFFSET", "inode", "i_mode"),
    ("INODE_RDEV_OFFSET", "inode", "i_rdev"),
    ("INODE_SB_OFFSET", "inode", "i_sb"),
    ("SB_DEV_OFFSET", "super_block", "s_dev"),
)
# Every (struct, member) the BPF programs reach by offset (see the functions below).
_MEMBERS = (*(("task_struct", member) for member in ("thread.fsbase", "tgid", "pid", "group_leader", "start_boottime")),
            *((struct_name, member) for _, struct_name, member in FILE_DEVICE_MEMBERS))


@functools.lru_cache(maxsize=4)
def _kernel_offsets(path: str) -> dict[tuple[str, str], int | str]:
    """Each of _MEMBERS's offsets, or why the BTF does not give it, from one parse. A parse costs
    0.3 s, and a receiver asked for three or four at each start; the running kernel's BTF does not
    change under it, and the result is a few numbers (the parse itself is megabytes, not kept)."""
    try:
        btf = Btf.of_running_kernel(path)
    except BtfError as error:
        return dict.fromkeys(_MEMBERS, str(error))
    found: dict[tuple[str, str], int | str] = {}
    for struct_name, member in _MEMBERS:
        try:
            found[(struct_name, member)] = btf.member_offset(struct_name, member)
        except BtfError as error:
            found[(struct_name, member)] = str(error)
    return found


def _member(path: str, struct_name: str, member: str) -> int:
    offset = _kernel_offsets(path)[(struct_name, member)]
    if isinstance(offset, str):
        raise BtfError(offset)
    return offset


def _task_member(path: str, member: str) -> int:
    return _member(path, "task_struct", member)


def task_fsbase_offset(path: str = VMLINUX_BTF) -> int:
    """Where task_struct keeps the thread's TLS base (x86-64: thread.fsbase)."""
    return _task_member(path, "thread.fsbase")


def task_tgid_offset(path: str = VMLINUX_BTF) -> int:
    """Where task_struct keeps its process's id (the BPF program reads a forked child's)."""
    return _task_member(path, "tgid")


def task_pid_offset(path: str = VMLINUX_BTF) -> int:
    """Where task_struct keeps the thread's id (off-CPU profiling reads the next thread's)."""
    return _task_member(path, "pid")


def task_start_offsets(path: str = VMLINUX_BTF) -> tuple[int, int]:
    """Where task_struct keeps its thread group leader and its start_boottime: the BPF program
    dates each sample's process by its leader's (what /proc/PID/stat's starttime shows)."""
    return _task_member(path, "group_leader"), _task_member(path, "start_boottime")


def file_device_offsets(path: str = VMLINUX_BTF) -> dict[str, int]:
    """{cflag: offset} of FILE_DEVICE_MEMBERS in the running kernel."""
    return {flag: _member(path, struct_name, member) for flag, struct_name, member in FILE_DEVICE_MEMBERS}
