"""A process's life has one owner (receivers/profiling/processes/table.py): a pid that exits and is
taken by another process is never confused with its successor.

The successor gets the pid for real: as root, /proc/sys/kernel/ns_last_pid makes the next fork
take the pid we want (as CRIU restores processes). The table-level tests watch what the owner tells
its watchers; the receiver-level one (real BPF) reads the kernel's per-process entries.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from pycollector.testing import receiver_of

from receivers.profiling.processes.proc import parse_stat
from receivers.profiling.processes.table import IncarnationGone, ProcessTable

from tests.conftest import bpf_unavailable_reason, capturing_service, loaded, spawn_with_pid

SPIN = "while True: pass"


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return parse_stat(stat.read())["starttime"]


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
        # Its exec finished: announced while the kernel still shows the forked copy of this
        # process, it would rightly be registered twice (an exec while registering).
        loaded(first.pid)
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
            removed = receiver.processes.forget_exited()
            assert removed in ([pid], [])
            entry = unwind_processes.get(unwind_processes.Key(pid))
            known = receiver._sampler._known
            if entry is None and known.get(known.Key(pid)) is None and removed == [] and receiver.processes.lookup(pid) is not None:
                # Sampled between its fork and its exec (ci2 of session 32), it was announced and
                # registered as a copy of this python; its exec then made the kernel forget it and
                # drop that entry, so its next sample announces it again as what it runs now.
                # (What the test guards against: an entry gone while the kernel still knows the pid,
                # whose samples would then never be announced nor walked.)
                return
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


# A busy program whose hot function is NAME; non-PIE, so it runs where it was linked (flags may
# move it: two programs that share no address cannot be named by each other's files).
SPIN_C = r"""
volatile unsigned long sink;
__attribute__((noinline)) void NAME(void) { for (;;) sink++; }
int main(void) { NAME(); return 0; }
"""


def spin_program(directory, name: str, *flags: str) -> tuple[str, int]:
    """(path, address of its function ``name``) of a spinning program built in ``directory``."""
    source = directory / f"{name}.c"
    source.write_text(SPIN_C.replace("NAME", name))
    program = directory / name
    subprocess.run(["gcc", "-O2", "-no-pie", "-fno-omit-frame-pointer", *flags, "-o", str(program), str(source)], check=True, capture_output=True)
    symbols = subprocess.run(["nm", str(program)], capture_output=True, text=True, check=True).stdout
    return str(program), next(int(line.split()[0], 16) for line in symbols.splitlines() if line.endswith(f" {name}"))


def test_each_incarnation_of_a_pid_has_its_own_snapshot():
    """A sample is its process's by its pid and its start time (the kernel dates it): the
    predecessor's snapshot stays for its last samples after its successor is registered; a
    successor not announced yet is read from /proc; a process gone unknown under a pid another
    holds is refused, not named as that other."""
    table = ProcessTable()
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Its exec finished: announced while the kernel still shows the forked copy of this
        # process, it would rightly be registered twice (an exec while registering).
        loaded(first.pid)
        before = table.on_new_process(first.pid, first.pid, "python3")
        assert table.incarnation(first.pid, before.start_time_ticks) is before
    finally:
        first.kill()
        first.wait()
    pid = first.pid
    successor = spawn_with_pid(pid, ["sleep", "60"])
    try:
        info = table.incarnation(pid, start_time(pid))  # (its announcement not handled yet)
        assert info is table.current(pid) and info.exe_path == os.path.realpath("/usr/bin/sleep")
        assert table.incarnation(pid, before.start_time_ticks) is before and before.exited
        assert (table.stats["incarnations_read"], table.stats["predecessors"]) == (1, 1)
        with pytest.raises(IncarnationGone):  # one never known, gone, its pid another's now
            table.incarnation(pid, before.start_time_ticks - 1)
        assert table.incarnation(pid, None) is info  # (undated: by pid, as before)
        table.forget_exited()
        assert table.incarnation(pid, before.start_time_ticks) is before  # its samples may still come
        table.forget_exited()
        with pytest.raises(IncarnationGone):
            table.incarnation(pid, before.start_time_ticks)
        assert table.incarnation(pid, info.start_time_ticks) is info
    finally:
        successor.kill()
        successor.wait()
    gone, started = exited_process()
    if not os.path.exists(f"/proc/{gone}"):  # (unless the host took its pid meanwhile)
        assert ProcessTable().incarnation(gone, started) is None  # reported by its threads' names, as before


def test_a_report_names_each_incarnation_of_a_pid_by_its_own_program(tmp_path):
    """Samples of two processes that had one pid, in one interval: each is named by its own
    program's file, and a third's (gone unknown, its pid another's) is dropped and counted."""
    from pycollector.pdata import iter_samples
    from receivers.profiling.kernel.samples import Interval, StackCount
    from receivers.profiling.report import ReportBuilder

    with two_incarnations(tmp_path) as (table, symbolizer, before, after, functions):
        pid = after.pid
        stacks = [StackCount(pid, pid, "first_spin", [], [functions[0]], 3, start_ticks=before.start_time_ticks),
                  StackCount(pid, pid, "second_spin", [], [functions[1]], 4, start_ticks=after.start_time_ticks),
                  StackCount(pid, pid, "third", [], [functions[1]], 5, start_ticks=before.start_time_ticks - 1)]
        dropped = []
        data = ReportBuilder(table, symbolizer).build(Interval(stacks, 0, 1, 0, 1, frequency_hz=100),
                                                      on_dropped=lambda *drop: dropped.append(drop))
        named = {(view.resource["process.executable.name"], view.frames[0].function, os.path.basename(view.frames[0].mapping_filename),
                  view.values[0]) for view in iter_samples(data)}
        assert named == {("first_spin", "first_spin", "first_spin", 3), ("second_spin", "second_spin", "second_spin", 4)}
        assert dropped == [(pid, 5, 0, "pid_reused")]


@contextlib.contextmanager
def two_incarnations(tmp_path):
    """A pid's two processes, each running a program of its own (named first_spin and
    second_spin, their code at different addresses): (table, symbolizer, the predecessor's
    snapshot, the live successor's, the two programs' function addresses)."""
    from receivers.profiling.symbols.symbolizer import Symbolizer

    first_program, first_function = spin_program(tmp_path, "first_spin")
    second_program, second_function = spin_program(tmp_path, "second_spin", "-Wl,-Ttext-segment=0x20000000")
    table = ProcessTable()
    symbolizer = Symbolizer(table)  # (before the snapshots: it keeps their files open)
    first = subprocess.Popen([first_program])
    try:
        loaded(first.pid)
        before = table.on_new_process(first.pid, first.pid, "first_spin")
    finally:
        first.kill()
        first.wait()
    successor = spawn_with_pid(first.pid, [second_program])
    try:
        after = table.on_new_process(first.pid, first.pid, "second_spin")  # its announcement
        yield table, symbolizer, before, after, (first_function, second_function)
    finally:
        successor.kill()
        successor.wait()


class OneKindRuntime:
    """A runtime (runtime_stacks.Runtime) whose frames are the kernel's kind 4, each named by the
    program of the process it attached to: whose state named a frame is in the frame's name."""

    kinds, appended, stats = frozenset({4}), False, {}

    def __init__(self) -> None:
        from receivers.profiling.processes.runtime_processes import RuntimeProcesses
        self._processes = RuntimeProcesses(KernelTable(), Attached, lambda process: 0, lambda process: None)

    def register(self, info) -> None:
        self._processes.register(info)

    def forget(self, tgid: int) -> None:
        self._processes.forget(tgid)

    def knows(self, tgid: int, started: int | None = None) -> bool:
        return self._processes.get(tgid, started) is not None

    def new_report(self, budget) -> None:
        pass

    def has_next(self, kind: int) -> bool:
        return False

    def name(self, tgid: int, stack, started: int | None = None):
        from receivers.profiling.symbols import runtime_stacks
        from receivers.profiling.symbols.frame import Frame
        process = self._processes.get(tgid, started)
        if process is None:
            return stack
        return runtime_stacks.name_recorded(stack, self.kinds, lambda recorded: [Frame(0, "runtime", name=f"of {process.info.comm}")])


class Attached:
    def __init__(self, info) -> None:
        self.info = info


class KernelTable(dict):
    Key = int


def test_a_runtime_attached_to_a_pids_successor_names_none_of_its_predecessors_frames(tmp_path):
    """The samples of a process whose pid another took since, with frames of a runtime attached
    to the successor: the successor's state names the successor's frames only; the predecessor's
    stay nameless rather than named from another process's memory."""
    from pycollector.pdata import iter_samples
    from receivers.profiling.kernel.samples import Interval, StackCount
    from receivers.profiling.report import ReportBuilder
    from receivers.profiling.symbols.runtime_stacks import KIND_SHIFT, TAG

    with two_incarnations(tmp_path) as (table, symbolizer, before, after, functions):
        runtime = OneKindRuntime()
        runtime.register(after)  # (the predecessor's state was dropped when the successor's came)
        pid, runtime_frame = after.pid, TAG | (4 << KIND_SHIFT) | 0x1000
        stacks = [StackCount(pid, pid, "first_spin", [], [runtime_frame, functions[0]], 3, start_ticks=before.start_time_ticks),
                  StackCount(pid, pid, "second_spin", [], [runtime_frame, functions[1]], 4, start_ticks=after.start_time_ticks)]
        builder = ReportBuilder(table, symbolizer)
        builder.runtimes = [runtime]
        data = builder.build(Interval(stacks, 0, 1, 0, 1, frequency_hz=100))
        leaves = {view.resource["process.executable.name"]: view.frames[0].function for view in iter_samples(data)}
        assert leaves == {"first_spin": "", "second_spin": "of second_spin"}


def test_a_snapshot_leads_to_the_newest_of_its_process_and_to_nothing_once_its_pid_is_anothers():
    """What a report named a process with may be an older object than the table's (its maps read
    again meanwhile): it still leads to that process's newest snapshot (its mappings, its SDK
    resource, its JIT names), and to nothing once another process holds the pid."""
    table = ProcessTable()
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        loaded(first.pid)
        named = table.on_new_process(first.pid, first.pid, "python3")
        refreshed = table.refresh_maps(first.pid, rate_limited=False)
        assert refreshed is not None and refreshed is not named
        assert table.newest(named) is refreshed and table.newest(refreshed) is refreshed
    finally:
        first.kill()
        first.wait()
    successor = spawn_with_pid(first.pid, ["sleep", "60"])
    try:
        table.on_new_process(successor.pid, successor.pid, "sleep")
        assert table.newest(named) is None and table.newest(refreshed) is None
    finally:
        successor.kill()
        successor.wait()
