"""The BPF maps user space reads and fills, over their file descriptors.

The operations are those of BCC's table classes, with the same behaviour (a missing key is a
KeyError, an array's index is checked against its size, deleting from an array zeroes the entry,
a per-CPU value is one per possible CPU, padded to 8 bytes), without needing the compiled
program's BCC module: ``Key`` and ``Leaf`` are built from the layouts the compile cache keeps.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from collections.abc import Callable, Iterator, MutableMapping

from receivers.profiling.kernel import bcc_bpf, ctypes_layout
from receivers.profiling.kernel.compiled import MapSpec

HASH, ARRAY, PROG_ARRAY, PERF_EVENT_ARRAY, PERCPU_ARRAY, STACK_TRACE, LRU_HASH = 1, 2, 3, 4, 6, 7, 9


class MapError(OSError):
    """A map operation the kernel refused."""


def _refused(what: str, name: str) -> MapError:
    code = ct.get_errno()
    return MapError(code, f"{what} on map {name}: {os.strerror(code)}")


class BpfMap(MutableMapping):
    """A hash-like map: keys() walks the kernel's key order (``get``, ``in`` and the rest of a
    mapping, as BCC's tables have them)."""

    def __init__(self, spec: MapSpec, fd: int) -> None:
        self.name = spec.name
        self.fd = fd
        self.map_fd = fd  # (BCC's name for it)
        self.max_entries = spec.max_entries
        self.Key = ctypes_layout.build(spec.key)
        self.Leaf = ctypes_layout.build(spec.value)
        self._lib = bcc_bpf.lib()

    def _key(self, key):
        return key

    def __getitem__(self, key):
        leaf = self.Leaf()
        if self._lib.bpf_lookup_elem(self.fd, ct.byref(self._key(key)), ct.byref(leaf)) < 0:
            raise KeyError(key)
        return leaf

    def __setitem__(self, key, leaf) -> None:
        if self._lib.bpf_update_elem(self.fd, ct.byref(self._key(key)), ct.byref(leaf), 0) < 0:
            raise _refused("update", self.name)

    def __delitem__(self, key) -> None:
        if self._lib.bpf_delete_elem(self.fd, ct.byref(self._key(key))) < 0:
            raise KeyError(key)

    def keys(self) -> Iterator:
        key = None
        while True:
            following = self.Key()
            if key is None:
                found = self._lib.bpf_get_first_key(self.fd, ct.byref(following), ct.sizeof(self.Key))
            else:
                found = self._lib.bpf_get_next_key(self.fd, ct.byref(key), ct.byref(following))
            if found < 0:
                return
            yield following
            key = following

    __iter__ = keys

    def __len__(self) -> int:
        return sum(1 for _ in self.keys())

    def items(self) -> list:
        found = []
        for key in self.keys():
            try:
                found.append((key, self[key]))
            except KeyError:  # (deleted by the program between the walk and the read)
                continue
        return found

    def values(self) -> list:
        return [value for _, value in self.items()]

    def clear(self) -> None:
        for key in list(self.keys()):
            try:
                del self[key]
            except KeyError:
                continue

    def items_update_batch(self, keys, values) -> None:
        count = ct.c_uint32(len(keys))
        if len(keys) != len(values) or not 0 < len(keys) <= self.max_entries:
            raise ValueError(f"map {self.name}: {len(keys)} keys and {len(values)} values")
        if self._lib.bpf_update_batch(self.fd, ct.byref(keys), ct.byref(values), ct.byref(count)) != 0:
            raise _refused("update batch", self.name)

    def items_lookup_batch(self) -> Iterator:
        return self._batch(self._lib.bpf_lookup_batch)

    def items_lookup_and_delete_batch(self) -> Iterator:
        return self._batch(self._lib.bpf_lookup_and_delete_batch)

    def _batch(self, operation: Callable) -> Iterator:
        """Every entry, read in batches into arrays as large as the map (as BCC's table does)."""
        size = self.max_entries
        keys, values = (self.Key * size)(), (self.Leaf * size)()
        position, count = ct.c_uint32(0), ct.c_uint32(0)
        total = 0
        while total < size:
            count.value = size - total
            result = operation(self.fd, ct.byref(position) if total else None, ct.byref(position),
                               ct.byref(keys, ct.sizeof(self.Key) * total), ct.byref(values, ct.sizeof(self.Leaf) * total),
                               ct.byref(count))
            code = ct.get_errno()
            total += count.value
            if result != 0:
                if code != errno.ENOENT:  # (ENOENT: the last batch)
                    raise MapError(code, f"batch read of map {self.name}: {os.strerror(code)}")
                break
            if count.value == 0:
                break
        for index in range(total):
            yield keys[index], values[index]


class ArrayMap(BpfMap):
    """An array: every index from 0 to max_entries - 1 exists; deleting one zeroes it."""

    def _key(self, key):
        if isinstance(key, int):
            key = self.Key(key + self.max_entries if key < 0 else key)  # (from the end, as a list's)
        if not 0 <= key.value < self.max_entries:
            raise IndexError(f"map {self.name}: index {key.value} out of range")
        return key

    def __len__(self) -> int:
        return self.max_entries

    def keys(self) -> Iterator:
        return (self.Key(index) for index in range(self.max_entries))

    __iter__ = keys

    def __delitem__(self, key) -> None:
        self[key] = self.Leaf()


class PerCpuArrayMap(ArrayMap):
    """A per-CPU array: a value is one per possible CPU, each padded to 8 bytes."""

    def __init__(self, spec: MapSpec, fd: int) -> None:
        super().__init__(spec, fd)
        self.one_cpu = self.Leaf
        cpus = len(bcc_bpf.cpus("possible"))
        if ct.sizeof(self.one_cpu) % 8 == 0:
            self.Leaf = self.one_cpu * cpus
        elif self.one_cpu in (ct.c_uint, ct.c_int):
            self.Leaf = (ct.c_uint64 if self.one_cpu is ct.c_uint else ct.c_int64) * cpus
        else:
            raise ValueError(f"map {self.name}: a per-CPU value must be 8-byte aligned")

    def sum(self, key):
        return self.one_cpu(sum(self[key]))


class ProgArrayMap(ArrayMap):
    def __setitem__(self, key, leaf) -> None:
        super().__setitem__(key, self.Leaf(leaf) if isinstance(leaf, int) else leaf)

    def __delitem__(self, key) -> None:
        if self._lib.bpf_delete_elem(self.fd, ct.byref(self._key(key))) < 0:
            raise KeyError(key)


class PerfEventArrayMap(ArrayMap):
    """A perf output map: a ring buffer per online CPU, read by ``poll`` of the program that owns them."""

    def __init__(self, spec: MapSpec, fd: int, event: type | None, readers: dict) -> None:
        super().__init__(spec, fd)
        self.event_type = event
        self._readers = readers  # the owner's, (map name, cpu) -> reader
        self._callbacks: list = []  # (ctypes keeps no reference to the C callbacks it is given)

    def open_perf_buffer(self, callback: Callable[[int, int, int], None], page_cnt: int = 8,
                         lost_cb: Callable[[int], None] | None = None, wakeup_events: int = 1) -> None:
        if page_cnt < 1 or page_cnt & (page_cnt - 1):
            raise ValueError("page_cnt must be a power of two")
        for cpu in bcc_bpf.cpus("online"):
            self._open(cpu, callback, page_cnt, lost_cb, wakeup_events)

    def _open(self, cpu: int, callback, page_cnt: int, lost_cb, wakeup_events: int) -> None:
        on_data = bcc_bpf.RAW_CALLBACK(lambda _cookie, data, size: callback(cpu, data, size))
        on_lost = bcc_bpf.LOST_CALLBACK(lambda _cookie, lost: lost_cb(lost)) if lost_cb else ct.cast(None, bcc_bpf.LOST_CALLBACK)
        options = bcc_bpf.PerfBufferOptions(pid=-1, cpu=cpu, wakeup_events=wakeup_events)
        reader = self._lib.bpf_open_perf_buffer_opts(on_data, on_lost, None, page_cnt, ct.byref(options))
        if not reader:
            raise _refused(f"opening the perf buffer of CPU {cpu}", self.name)
        self._callbacks.append((on_data, on_lost))
        self._readers[(self.name, cpu)] = reader
        self[self.Key(cpu)] = self.Leaf(self._lib.perf_reader_fd(reader))


_KINDS = {HASH: BpfMap, LRU_HASH: BpfMap, STACK_TRACE: BpfMap, ARRAY: ArrayMap,
          PERCPU_ARRAY: PerCpuArrayMap, PROG_ARRAY: ProgArrayMap}


def map_over(spec: MapSpec, fd: int, readers: dict) -> BpfMap:
    """The object for a map of ``spec``'s kind over ``fd``."""
    if spec.type == PERF_EVENT_ARRAY:
        return PerfEventArrayMap(spec, fd, ctypes_layout.build(spec.event) if spec.event is not None else None, readers)
    if spec.type not in _KINDS:
        raise ValueError(f"map {spec.name}: kind {spec.type} is not one user space reads")
    return _KINDS[spec.type](spec, fd)
