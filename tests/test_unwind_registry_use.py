"""Which files' rows count as idle (receivers/profiling/unwind/registry.py), without BPF: the
kernel's maps are dicts here, the files real, their rows made up.

ci4 of session 32: with an idle timeout shorter than the sweep's interval, a program's library
that it ran in at that moment looked idle (its use not yet read from the kernel's marks) and was
given to the next file that wanted room, then loaded again, back and forth: half of its stacks
stopped inside the library."""

from __future__ import annotations

import ctypes
import os

import pytest

from receivers.profiling.processes.proc import Mapping, ProcessInfo
from receivers.profiling.unwind import registry as registry_module
from receivers.profiling.unwind.registry import MAX_MAPPINGS, UnwindRegistry
from receivers.profiling.unwind.rows import ROW_SIZE

from tests.conftest import wait_for

ROWS_PER_FILE = 1000


class _Id(int):
    """A key or value as BCC gives an array's: .value is the number."""

    @property
    def value(self) -> int:
        return int(self)


class _Table(dict):
    Key = Leaf = _Id

    def items_lookup_batch(self):
        return [(int(key), int(value)) for key, value in self.items()]


class _Files(dict):
    Key = _Id

    @staticmethod
    def Leaf(first: int, count: int) -> tuple[int, int]:  # noqa: N802 - BCC's name
        return (first, count)


class _Entry(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("bias", ctypes.c_uint64),
                ("file_id", ctypes.c_uint32), ("kind", ctypes.c_uint32)]


class _Processes(dict):
    Key = _Id

    class Leaf(ctypes.Structure):
        _fields_ = [("count", ctypes.c_uint32), ("mappings", _Entry * MAX_MAPPINGS)]


class _Rows(dict):
    Key = ctypes.c_uint32
    Leaf = ctypes.c_char * ROW_SIZE

    def items_update_batch(self, keys, values) -> None:
        self.update(zip(keys, map(bytes, values)))


class _Maps:
    def __init__(self) -> None:
        self.rows, self.files, self.processes = _Rows(), _Files(), _Processes()
        self.demand, self.used = _Table(), _Table()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def files(tmp_path, monkeypatch):
    """Three files, each with ROWS_PER_FILE rows; opened by their path (no process maps them)."""
    paths = []
    for name in ("first.so", "second.so", "third.so"):
        (tmp_path / name).write_bytes(b"not elf: its rows are made up")
        paths.append(tmp_path / name)
    monkeypatch.setattr(registry_module, "open_mapped_file", lambda info, mapping: os.open(mapping.path, os.O_RDONLY))
    return paths


def _process(pid: int, path) -> ProcessInfo:
    status = path.stat()
    mapping = Mapping(0x10000, 0x20000, 0, "r-xp", f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}",
                      status.st_ino, str(path))
    return ProcessInfo(pid=pid, mappings=[mapping])


def _registered(registry: UnwindRegistry, maps: _Maps, info: ProcessInfo) -> int:
    """Register ``info``; the id its file got (the registry zeroes the new id's demand count)."""
    before = set(maps.demand)
    registry.register(info)
    (file_id,) = set(maps.demand) - before
    return file_id


def test_a_file_a_walk_used_since_the_last_sweep_keeps_its_rows(files, monkeypatch):
    """Two files loaded, the first before the second; the budget holds two. Both were loaded long
    ago past the idle timeout, but the kernel marked the first's rows used since the last sweep.
    A third file that needs room takes the second's rows, not the first's (which the older
    last_used alone would have chosen)."""
    monkeypatch.setattr(registry_module, "SWEEP_INTERVAL_S", 3600.0)  # (no sweep reads the mark before the search for room)
    maps, clock = _Maps(), _Clock()
    registry = UnwindRegistry(maps, lambda fd, path, open_debug, may_wait=True: b"\0" * (ROW_SIZE * ROWS_PER_FILE),
                              _NoLog(), max_files=16, row_budget=2 * ROWS_PER_FILE, idle_s=2.0, clock=clock)
    try:
        first, second, third = (_process(pid, path) for pid, path in zip((101, 102, 103), files))
        keys = [info.mappings[0].identity for info in (first, second, third)]
        first_id = _registered(registry, maps, first)
        assert wait_for(lambda: registry.file_state(keys[0]) == "loaded")
        clock.now += 1
        registry.register(second)
        assert wait_for(lambda: registry.file_state(keys[1]) == "loaded")
        clock.now += 60  # both idle by their last sweep ...
        maps.used[_Id(first_id)] = _Id(1)  # ... but a walk used the first's rows since
        third_id = _registered(registry, maps, third)
        maps.demand[_Id(third_id)] = _Id(5)  # its code was sampled (the budget is short: only such files load)
        assert wait_for(lambda: registry.file_state(keys[2]) == "loaded"), registry.stats
        assert registry.file_state(keys[0]) == "loaded" and registry.file_state(keys[1]) == "evicted", registry.stats
        assert maps.used[_Id(first_id)] == 0  # the mark was read (and reset) for the choice
    finally:
        registry.close()


class _NoLog:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None
