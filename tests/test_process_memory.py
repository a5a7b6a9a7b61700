"""Reading another process's memory (processes/memory.py): what it gives while the process runs,
and that once the process has exited (a zombie, or reaped) every read says so, which the namers
rely on to keep what they read while it ran."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from receivers.profiling.processes.memory import MemoryReadError, ProcessExited, ProcessMemory

# A child that prints where a known buffer of its own is, then waits to be killed.
CHILD = """
import ctypes, sys, time
buffer = ctypes.create_string_buffer(b"pycollector reads this", 64)
print(ctypes.addressof(buffer), flush=True)
time.sleep(60)
"""


@pytest.fixture
def child():
    process = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    address = int(process.stdout.readline())
    yield process, address
    process.kill()
    process.wait()


def test_a_running_process_is_read_and_an_unmapped_address_is_an_error(child):
    process, address = child
    with ProcessMemory(process.pid) as memory:
        assert memory.read(address, 22) == b"pycollector reads this"
        for bad in (4096, 1 << 50):  # (the first page is never mapped; the second is past the top of user space)
            with pytest.raises(MemoryReadError) as unmapped:
                memory.read(bad, 8)
            assert not isinstance(unmapped.value, ProcessExited)
        assert not memory.exited
        assert memory.read(address, 22) == b"pycollector reads this"


@pytest.mark.parametrize("reaped", [False, True], ids=["zombie", "reaped"])
def test_a_process_that_exited_says_so_and_stays_exited(child, reaped):
    process, address = child
    with ProcessMemory(process.pid) as memory:
        assert memory.read(address, 8) == b"pycollec"
        process.kill()
        if reaped:
            process.wait()
        else:
            deadline = time.monotonic() + 5  # (until the kernel has torn down its memory)
            while _state(process.pid) != "Z" and time.monotonic() < deadline:
                time.sleep(0.01)
        with pytest.raises(ProcessExited, match="has exited"):
            memory.read(address, 8)
        assert memory.exited
        with pytest.raises(ProcessExited):  # (and no read is tried again)
            memory.read(address, 8)


def test_a_read_past_user_space_or_over_the_bound_is_refused(child):
    process, address = child
    with ProcessMemory(process.pid) as memory:
        for bad_address, size in ((1 << 63, 8), (address, 1 << 30), (0, 8)):
            with pytest.raises(MemoryReadError):
                memory.read(bad_address, size)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except OSError:
        return ""

