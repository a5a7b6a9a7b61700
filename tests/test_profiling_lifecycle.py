"""A process's life has one owner (receivers/profiling/processes/table.py): a pid that exits and is
taken by another process is never confused with its successor.

The successor gets the pid for real: as root, /proc/sys/kernel/ns_last_pid makes the next fork
take the pid we want (as CRIU restores processes). The table-level tests watch what the owner tells
its watchers; the receiver-level one (real BPF) reads the kernel's per-process entries.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pycollector.testing import receiver_of

from receivers.profiling.processes.proc import parse_stat
from receivers.profiling.processes.table import ProcessTable

from tests.conftest import bpf_unavailable_reason, capturing_service

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
SPIN = "while True: pass"


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return parse_stat(stat.read())["starttime"]


def spawn_with_pid(pid: int, argv: list[str]) -> subprocess.Popen:
    """A process that has ``pid``: the next fork after ns_last_pid = pid - 1 takes it, unless
    another process of the host forked in between; then try again."""
    if os.geteuid() != 0:
        pytest.skip("choosing a pid (ns_last_pid) needs root")
    # Start times count clock ticks (10 ms): a successor started in the same tick would look like
    # the same incarnation. On a real host the pid space wraps far slower than that.
    time.sleep(0.05)
    for _ in range(20):
        with open(NS_LAST_PID, "w") as last:
            last.write(str(pid - 1))
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        if child.pid == pid:
            loaded(child.pid)
            return child
        child.kill()
        child.wait()
    pytest.skip(f"could not get pid {pid} again: the host forks too often")


def loaded(pid: int) -> None:
    """Wait until the program has its libraries mapped: Popen returns once exec began, before the
    kernel and ld.so have mapped everything."""
    deadline = time.monotonic() + 10
    while "libc.so" not in open(f"/proc/{pid}/maps").read():
        assert time.monotonic() < deadline, f"pid {pid} never mapped libc"
        time.sleep(0.01)


def exited_process() -> tuple[int, int]:
    """(pid, start time) of a process that ran and was reaped."""
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    started = start_time(gone.pid)
    gone.wait()
    return gone.pid, started


class Watcher:
    def __init__(self, table: ProcessTable) -> None:
        self.events: list[tuple[str, int, int | None]] = []
        table.watch(changed=lambda info: self.events.append(("changed", info.pid, info.start_time_ticks)),
                    exited=lambda pid: self.events.append(("exited", pid, None)))


def test_a_reused_pid_is_told_exited_once_then_its_successor_registered():
    table = ProcessTable()
    watcher = Watcher(table)
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        before = table.on_new_process(first.pid, first.pid, "python3")
    finally:
        first.kill()
        first.wait()
    assert table.forget_exited() == []  # marked: its last samples may still be reported
    successor = spawn_with_pid(first.pid, ["sleep", "60"])
    try:
        assert table.forget_exited() == [first.pid]
        info = table.lookup(first.pid)
        assert info is not None and not info.exited
        assert info.start_time_ticks == start_time(successor.pid) != before.start_time_ticks
        assert info.exe_path == os.path.realpath("/usr/bin/sleep")
        assert watcher.events == [("changed", first.pid, before.start_time_ticks),
                                  ("exited", first.pid, None),
                                  ("changed", first.pid, info.start_time_ticks)]
        assert table.stats["successors"] == 1
        assert table.forget_exited() == []  # the successor is alive: nothing more to forget
    finally:
        successor.kill()
        successor.wait()


def test_a_successor_announced_during_the_scan_is_not_forgotten():
    """The scan lists the table, then removes what was marked; the successor's announcement
    (the events thread) lands between the two: no exit may be told for the pid after it."""
    table = ProcessTable()
    watcher = Watcher(table)
    pid, _ = exited_process()
    table.on_new_process(pid, pid, "python3")  # announced after its exit: marked exited already
    successor = spawn_with_pid(pid, ["sleep", "60"])
    bystander = subprocess.Popen(["sleep", "60"])  # the scan reads its stat after listing the table
    table.on_new_process(bystander.pid, bystander.pid, "sleep")
    original = table._same_incarnation

    def announce_then_check(info):
        if info.pid == bystander.pid:  # mid-scan: the successor of `pid` is announced
            table.on_new_process(pid, pid, "sleep")
        return original(info)

    table._same_incarnation = announce_then_check
    try:
        assert table.forget_exited() == []
        info = table.lookup(pid)
        assert info is not None and not info.exited and info.start_time_ticks == start_time(pid)
        # The predecessor's exit is told when its successor is announced, before it; the scan
        # tells none after: the successor's registration is the last word on the pid.
        of_pid = [event for event in watcher.events if event[1] == pid]
        assert of_pid[-1] == ("changed", pid, start_time(pid)), of_pid
        assert of_pid.count(("exited", pid, None)) == 1, of_pid
    finally:
        for process in (successor, bystander):
            process.kill()
            process.wait()


@pytest.mark.parametrize("program", ["/usr/bin/sleep", sys.executable], ids=["another program", "the same program"])
def test_a_process_that_execs_while_it_is_registered_is_registered_again_as_its_new_image(program):
    """A fork+exec child sampled before its exec: its maps are read, then it execs (the kernel
    clears its entry), then the watchers write what was read. The table sees the image changed
    (its program, or where its stack begins: an exec of the same program moves it) and registers
    the process again, so the watchers end with the new image's maps."""
    table = ProcessTable()
    go, went = os.pipe()
    argv = [program, "60"] if program.endswith("sleep") else [program, "-c", "import time; time.sleep(60)"]
    child = subprocess.Popen([sys.executable, "-c", f"import os; os.read({go}, 1); os.execv({program!r}, {argv!r})"],
                             pass_fds=(go,))
    os.close(go)
    loaded(child.pid)  # (its first image settled: /proc shows no start of stack while an exec finishes)
    told: list[set[tuple[int, int]]] = []

    def user_space(ranges) -> set[tuple[int, int]]:
        return {(start, end) for start, end in ranges if start < 1 << 63}  # (not [vsyscall])

    def executable_mappings() -> set[tuple[int, int]]:
        return user_space(tuple(int(part, 16) for part in line.split()[0].split("-"))
                          for line in open(f"/proc/{child.pid}/maps") if line.split()[1][2] == "x")

    def changed(info):
        told.append(user_space((mapping.start, mapping.end) for mapping in info.mappings))
        if len(told) == 1:  # the watcher writes the old image's maps while the process execs
            before = executable_mappings()
            os.write(went, b"x")
            deadline = time.monotonic() + 10
            while "libc.so" not in open(f"/proc/{child.pid}/maps").read() or executable_mappings() & before:
                assert time.monotonic() < deadline, "the child never exec'd"
                time.sleep(0.01)

    table.watch(changed=changed, exited=lambda pid: None)
    try:
        info = table.on_new_process(child.pid, child.pid, "python3")
        assert len(told) == 2 and table.lookup(child.pid) is info
        assert told[-1] == executable_mappings() != told[0]
        assert info.exe_path == os.path.realpath(program)
        assert table.stats["execs_while_registering"] == 1
    finally:
        os.close(went)
        child.kill()
        child.wait()


@pytest.mark.bpf
def test_the_kernel_keeps_the_entries_of_a_pid_reused_between_two_scans(tmp_path):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    service, _ = capturing_service(tmp_path, 199, reporter_interval="600s")  # (the test runs the scans the report thread would)
    service.start()
    try:
        receiver = receiver_of(service)
        unwind_processes = receiver._sampler.unwind_maps.processes
        busy = subprocess.Popen([sys.executable, "-c", SPIN])
        pid = busy.pid
        try:
            deadline = time.monotonic() + 20
            while unwind_processes.get(unwind_processes.Key(pid)) is None:  # sampled, announced, registered
                assert time.monotonic() < deadline, "the busy process was never registered"
                time.sleep(0.05)
        finally:
            busy.kill()
            busy.wait()
        assert receiver.processes.forget_exited() == []
        # Its successor sleeps: it is never sampled, so the kernel would never announce it.
        successor = spawn_with_pid(pid, ["sleep", "60"])
        try:
            # Its predecessor removed and it found alive, or (its exec announced first: the pid
            # was still among the kernel's known ones) already registered by its exec.
            assert receiver.processes.forget_exited() in ([pid], [])
            entry = unwind_processes.get(unwind_processes.Key(pid))
            assert entry is not None, "the successor lost its kernel entry with its predecessor's exit"
            mapped = {line.split()[0] for line in open(f"/proc/{pid}/maps")
                      if line.split()[1][2] == "x" and int(line.split("-")[0], 16) < 1 << 63}  # not [vsyscall]
            held = {f"{entry.mappings[i].start:x}-{entry.mappings[i].end:x}" for i in range(entry.count)}
            # The successor's mappings, not the python's: all of them, or (announced by a sample
            # at its exec, before ld.so mapped its libraries, and never sampled since) a part.
            assert held and held <= mapped, (held, mapped)
            assert receiver.processes.lookup(pid).exe_path == os.path.realpath("/usr/bin/sleep")
        finally:
            successor.kill()
            successor.wait()
    finally:
        service.shutdown()
