"""Runtime detection (CPython, V8, HotSpot) runs off the events thread, in a helper process killed
past its deadline (symbols/detection.py; issue 42). The first tests drive the process table and
PythonInterpreters as the events thread does, the kernel's table a dict; the last runs the receiver
(real BPF) and reads the kernel's entries.

A crafted file named like a libpython, within elf/bounded.py's caps, still takes tens of ms to
parse (note_bomb: 1,020 headers over 4,000 notes, about 50 ms here), and a process may map as many
distinct ones as it likes. Parsed inline, a process mapping 60 of them held the events thread
about 3 s (more on a loaded host), and every process announced after it waited.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import types

import pytest
import structlog

from pycollector.testing import receiver_of

from receivers.profiling.symbols import detection
from receivers.profiling.symbols.detection import PENDING, FileDetector
from receivers.profiling.processes.table import ProcessTable
from receivers.profiling.python.interpreters import PythonInterpreters

from tests.conftest import bpf_unavailable_reason, capturing_service
from tests.test_elf_bounds import note_bomb

CRAFTED = 60
PYTHON = os.path.realpath(sys.executable)  # (the venv's: the host's python3.11, libpython linked in)
# A CPython with a shared libpython, which ld.so maps above where the crafted files are mapped
# later: they come first in its maps, as an attacker would place them.
SHARED_PYTHON = os.path.expanduser("~/.pyenv/versions/3.12.1/bin/python3.12")

MAPS_CRAFTED = """
import mmap, os, sys, time
kept = []
for name in sorted(os.listdir(sys.argv[1])):
    with open(os.path.join(sys.argv[1], name), "rb") as f:
        kept.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC))
print("mapped", flush=True)
if sys.argv[2:] == ["spin"]:  # once told: its first sample, which announces it, shows them mapped
    sys.stdin.readline()
    while True:
        pass
time.sleep(120)
"""


def crafted_files(folder, count: int):
    """``count`` distinct files named like a libpython, each slow to read but within the caps."""
    folder.mkdir()
    bomb = note_bomb(aliases=1020, notes=4000)
    for n in range(count):
        (folder / f"libpython3.12.so.1.{n}").write_bytes(bomb + n.to_bytes(4, "little"))  # distinct inodes, each read
    return folder


class KernelTable(dict):
    """python_processes as a dict: the keys pids, the leaves namespaces."""

    Key = staticmethod(lambda pid: pid)
    Leaf = types.SimpleNamespace


def until(condition, timeout_s: float, step_s: float = 0.02) -> float | None:
    """Seconds until ``condition()`` held, None if it did not within ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(step_s)
    return None


def test_a_process_mapping_slow_files_delays_no_other_registration(tmp_path):
    """One process maps 60 crafted files named libpython3.12.so.1.N: registering it does not wait
    for them, nor does the process announced after it (a copy of python3.11: another file); that
    one's CPython is found while most of the crafted files still wait (each process's files in
    turn), and the first is registered once its own interpreter is read."""
    crafted = crafted_files(tmp_path / "crafted", CRAFTED)
    copy = tmp_path / "python3.11"
    shutil.copy(PYTHON, copy)
    table = ProcessTable()
    detector = FileDetector(structlog.get_logger(), deadline_s=30)
    told = []  # (pid, files still waiting) of each process told again

    def retell(pid: int, program: int) -> None:
        told.append((pid, detector.queued()))
        table.tell_again(pid, program)

    detector.retell = retell
    pythons = PythonInterpreters(KernelTable(), structlog.get_logger(), detector)
    table.watch(changed=pythons.register, exited=pythons.forget)
    first = subprocess.Popen([PYTHON, "-c", MAPS_CRAFTED, str(crafted)], stdout=subprocess.PIPE, text=True)
    second = subprocess.Popen([str(copy), "-c", "import time; time.sleep(120)"], stderr=subprocess.DEVNULL)
    try:
        assert first.stdout.readline() == "mapped\n"
        assert until(lambda: os.path.exists(f"/proc/{second.pid}/maps") and str(copy) in open(f"/proc/{second.pid}/maps").read(), 10)
        started = time.monotonic()
        table.on_new_process(first.pid, first.pid, "")  # as the events thread does, one after the other
        table.on_new_process(second.pid, second.pid, "")
        announced = time.monotonic() - started
        assert announced < 1.0, f"the events thread took {announced:.2f} s to register two processes"
        assert pythons.files.stats["detections"] == CRAFTED + 2 and pythons.files.stats["detections_deferred"] == CRAFTED + 2
        assert until(lambda: pythons._processes.get(second.pid) is not None, 20) is not None
        assert [waiting for pid, waiting in told if pid == second.pid][0] > CRAFTED // 2, f"the second process's file waited behind the first's: {told}"
        assert until(lambda: pythons._processes.get(first.pid) is not None, 60) is not None
        assert until(lambda: detector.queued() == 0, 60) is not None
        assert pythons.files.stats["detections_killed_deadline"] == pythons.files.stats["detections_killed_died"] == 0
        assert table.stats["told_again"] >= 2
    finally:
        detector.close()
        for process in (first, second):
            process.kill()
            process.wait()


def test_a_parse_past_its_deadline_is_killed_and_counted(tmp_path):
    """A parse that does not end holds the helper only to its deadline: the helper is killed, the
    file given up (its waiters not told again) and counted by runtime and reason; the next file is
    read by a new helper."""
    table = ProcessTable()
    detector = FileDetector(structlog.get_logger(), deadline_s=2)
    told = []
    detector.retell = lambda pid, program: told.append(pid)
    stuck = detector.files("test", "tests.detection_readers:blocks")
    sized = detector.files("test", "tests.detection_readers:size_of")
    info = table.snapshot(os.getpid())
    mapping = next(m for m in info.mappings if m.file_backed and os.path.realpath(m.path) == PYTHON)
    try:
        assert stuck.get(info, mapping) is PENDING
        assert until(lambda: stuck.stats["detections_killed_deadline"] == 1, 30) is not None
        assert until(lambda: stuck.get(info, mapping) is None, 5) is not None  # given up, not asked again
        assert stuck.stats["detections"] == 1 and told == []
        other = next(m for m in info.mappings if m.file_backed and m.identity != mapping.identity)
        assert sized.get(info, other) is PENDING
        assert until(lambda: sized.get(info, other) is not PENDING, 30) is not None
        assert sized.get(info, other) == os.stat(f"/proc/self/map_files/{other.start:x}-{other.end:x}").st_size
        assert told == [os.getpid()] and sized.stats["detections_killed_died"] == 0
    finally:
        detector.close()


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="binutils' objcopy is missing")
def test_a_debug_file_the_helper_needs_is_opened_here_as_the_process(tmp_path):
    """A stripped libpython2.7 keeps interp_head in its debug file only: the helper asks for the
    file its .gnu_debuglink names, and the detector opens it as the process that maps the library
    (the helper opens nothing) and sends it the descriptor."""
    from receivers.profiling.python.detect import detect_cpython

    library = os.path.expanduser("~/.pyenv/versions/2.7.18/lib/libpython2.7.so.1.0")
    if not os.path.exists(library):
        pytest.skip(f"{library} is not installed")
    folder = tmp_path / "lib"
    folder.mkdir()
    debug, stripped = tmp_path / "libpython.debug", folder / "libpython2.7.so.1.0"
    subprocess.run(["objcopy", "--only-keep-debug", library, str(debug)], check=True)
    subprocess.run(["objcopy", "--strip-all", f"--add-gnu-debuglink={debug}", library, str(stripped)], check=True)
    shutil.move(debug, folder / "libpython.debug")  # (where the link is looked for: beside the library)
    mapper = subprocess.Popen([PYTHON, "-c", MAPS_CRAFTED, str(folder)], stdout=subprocess.PIPE, text=True)
    detector = FileDetector(structlog.get_logger())
    cpythons = detector.files("cpython", "receivers.profiling.python.detect:detect_file")
    try:
        assert mapper.stdout.readline() == "mapped\n"
        info = ProcessTable().snapshot(mapper.pid)
        mapping = next(m for m in info.mappings if m.path == str(stripped))
        assert cpythons.get(info, mapping) is PENDING
        assert until(lambda: cpythons.get(info, mapping) is not PENDING, 30) is not None
        found = cpythons.get(info, mapping)
        assert found is not None and found.symbols == detect_cpython(library).symbols and "interp_head" in found.symbols
    finally:
        detector.close()
        mapper.kill()
        mapper.wait()


def test_without_a_helper_a_file_is_read_inline():
    """FileDetector(in_helper=False): a runtime constructed alone (tools, its own tests) reads a
    file at once, on the asking thread."""
    table = ProcessTable()
    pythons = PythonInterpreters(KernelTable(), structlog.get_logger())
    info = table.snapshot(os.getpid())
    mapping = next(m for m in info.mappings if m.file_backed and os.path.realpath(m.path) == PYTHON)
    found = pythons.files.get(info, mapping)
    assert found is not None and found is not PENDING and found.version == sys.version_info[:2]
    assert detection.PENDING is PENDING


@pytest.mark.bpf
def test_the_kernel_hears_of_a_process_while_another_s_files_are_read(tmp_path):
    """End to end: a CPython that maps 60 crafted files below its libpython, then spins; a
    python3.11 started once the first is announced gets its unwind entry in the kernel before the
    first's CPython entry, and its own CPython entry before the first's too; the first gets its
    own once its libpython is read. (Read inline on the events thread, the crafted files held
    every process announced after the first until the first's CPython was found: about 3 s.)"""
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    if not os.path.exists(SHARED_PYTHON):
        pytest.skip(f"{SHARED_PYTHON} is not installed")
    crafted = crafted_files(tmp_path / "crafted", CRAFTED)
    # Mapped before the receiver starts: the process is announced at its first sample, and its
    # start would be sampled before it maps them.
    first = subprocess.Popen([SHARED_PYTHON, "-c", MAPS_CRAFTED, str(crafted), "spin"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    second = None
    service, _ = capturing_service(tmp_path, 199, reporter_interval="600s")
    try:
        assert first.stdout.readline() == "mapped\n"
        service.start()
        receiver = receiver_of(service)
        unwind, pythons = receiver._sampler.unwind_maps.processes, receiver._sampler.unwind_maps.python

        def entered(table, pid: int) -> bool:
            return table.get(table.Key(pid)) is not None

        first.stdin.write("spin\n")
        first.stdin.flush()
        assert until(lambda: entered(unwind, first.pid), 20) is not None, "the first process was never registered"
        second = subprocess.Popen([PYTHON, "-c", "while True: pass"])
        waited = until(lambda: entered(unwind, second.pid), 20)
        assert waited is not None, "the second process was never registered"
        assert not entered(pythons, first.pid), f"the second process was registered only after the first's files were read ({waited:.2f} s)"
        assert until(lambda: entered(pythons, second.pid), 20) is not None
        assert not entered(pythons, first.pid), "the second process's CPython waited for the first's files"
        assert until(lambda: entered(pythons, first.pid), 60) is not None, "the first process's CPython was never registered"
        print(f"second process's unwind entry after {waited:.3f} s")
    finally:
        for process in (first, second):
            if process is not None:
                process.kill()
                process.wait()
        service.shutdown()
