"""Reading another process's memory (processes/memory.py): what it gives while the process runs,
and that once the process has exited (a zombie, or reaped) every read says so, which the namers
rely on to keep what they read while it ran."""

from __future__ import annotations

import subprocess
import sys
import threading
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



# A process that registers a megabyte with userfaultfd (for missing pages) and never answers a
# fault: argv[1] "user" asks for user-mode faults only (all an unprivileged user gets while
# vm.unprivileged_userfaultfd is 0), else kernel-mode faults too (root, CAP_SYS_PTRACE, or that
# sysctl at 1). Prints the range's address.
UFFD_C = r"""
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | (argc > 1 && !strcmp(argv[1], "user") ? UFFD_USER_MODE_ONLY : 0));
    struct uffdio_api api = {.api = UFFD_API};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) { perror("userfaultfd"); return 1; }
    char *range = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct uffdio_register registration = {.range = {.start = (unsigned long)range, .len = 1 << 20}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(uffd, UFFDIO_REGISTER, &registration)) { perror("UFFDIO_REGISTER"); return 1; }
    printf("%lu\n", (unsigned long)range);
    fflush(stdout);
    pause();
}
"""


@pytest.mark.parametrize("faults", ["user", "kernel"])
def test_a_page_a_process_serves_with_userfaultfd_is_an_error_not_a_wait(tmp_path, faults):
    """A process can point the reader at memory it registered with userfaultfd and never answer
    the fault. A read through /proc/PID/mem faults without leave to retry, which userfaultfd
    answers with an error (SIGBUS inside the kernel, EIO to the reader) rather than a wait, for
    both kinds of registration: the reading thread never waits for the process. (The read runs on
    a thread of its own, so a kernel that waited would fail this test rather than hang it.)"""
    (tmp_path / "uffd.c").write_text(UFFD_C)
    subprocess.run(["gcc", "-O2", "-o", str(tmp_path / "uffd"), str(tmp_path / "uffd.c")], check=True)
    process = subprocess.Popen([str(tmp_path / "uffd"), faults], stdout=subprocess.PIPE, text=True)
    try:
        address = int(process.stdout.readline())
        outcome: list = []

        def read() -> None:
            with ProcessMemory(process.pid) as memory:
                try:
                    outcome.append(memory.read(address + 4096, 8))
                except MemoryReadError as error:
                    outcome.append(error)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout=10)
        assert not reader.is_alive(), "the read waits for the process's fault handler"
        [error] = outcome
        assert isinstance(error, MemoryReadError) and not isinstance(error, ProcessExited), error
    finally:
        process.kill()
        process.wait()


UNTOUCHED = """
import mmap, ctypes, time
region = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # never touched: no page in memory
print(ctypes.addressof(ctypes.c_char.from_buffer(region)), flush=True)
time.sleep(60)
"""


def test_reads_of_pages_not_in_memory_cost_a_bounded_number_of_maps_reads():
    """A page not in memory is read only after the process's maps (and mount tables) show no FUSE
    file there: a process can point every frame at such pages, so those checks are held to
    SLOW_CHECKS_PER_S a second for each process; past that its reads of such pages fail, counted."""
    from receivers.profiling.processes import memory as memory_module

    process = subprocess.Popen([sys.executable, "-c", UNTOUCHED], stdout=subprocess.PIPE, text=True)
    try:
        address = int(process.stdout.readline())
        before = dict(memory_module.stats)
        with ProcessMemory(process.pid) as memory:
            started, refused = time.monotonic(), 0
            for page in range(200):
                try:
                    assert memory.read(address + page * 4096 * 16, 8) == bytes(8)  # (untouched: zeroes)
                except MemoryReadError:
                    refused += 1
            seconds = time.monotonic() - started
        checks = {name: count - before[name] for name, count in memory_module.stats.items()}
        assert checks["slow_checks"] <= memory_module.SLOW_CHECKS_PER_S * (1 + seconds) + 1, (checks, seconds)
        assert refused == checks["slow_checks_refused"] > 0, checks
    finally:
        process.kill()
        process.wait()
