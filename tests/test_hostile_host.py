"""Attacks on a running agent (real BPF) by an ordinary user, one per class of issue 25.

The agent runs in this process, root, reporting every second; a benign busy program (root's,
built with frame pointers) runs beside every attack. The attacker is user nobody (setpriv), with
a directory of its own, and plays each trick for a few seconds. Throughout every attack:

- a report leaves the agent every interval, and the benign process is in each, its hot function
  named (spin_heavy);
- the agent's resident memory stays within 64 MiB of what it was before the attacks;
- no byte of a root-only canary appears in anything the agent exported;

and the trick itself did what it was meant to be kept from doing (checked per attack).
"""

from __future__ import annotations

import collections
import os
import secrets
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, receiver_of, registry_with

from tests.conftest import WORKLOADS, bpf_unavailable_reason, capturing_service, spawn_with_pid

pytestmark = pytest.mark.bpf

NOBODY = 65534
INTERVAL_S = 1.0
ATTACK_S = 5.0
RSS_ALLOWANCE = 64 << 20
TOKEN = f"CANARY{secrets.token_hex(6)}"
ROW_BUDGET = 150_000
ENTRY = {"_start", "__libc_start_main", "__libc_start_call_main", "main"}  # where a C program's stacks end

# The attacker's busy program: non-PIE, so its code is at 0x401000 whatever runs it (a perf map
# or a debug file can then name it), and it runs for argv[1] seconds.
SPIN_C = r"""
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) void NAME(void) { for (int i = 0; i < 100000; i++) sink += i * 7; }
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do { NAME(); clock_gettime(CLOCK_MONOTONIC, &now); }
    while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
"""


def compile_c(source: str, out: Path, *flags: str) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-O2", *flags, "-o", str(out), str(src)], check=True, capture_output=True)
    return out


def debuglink_section(name: bytes, crc: int = 0) -> bytes:
    """.gnu_debuglink's content: a name, NUL, padding to 4, the debug file's CRC-32."""
    padded = name + b"\0" * (4 - len(name) % 4)
    return padded + struct.pack("<I", crc)


def rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


class Arena:
    """The agent, the benign process, and where the attacker works."""

    def __init__(self, root: Path, service: Service, capture: CapturingExporterFactory, benign: subprocess.Popen):
        self.root, self.service, self.capture, self.benign = root, service, capture, benign
        self.attacker_dir = root / "attacker"
        self.idle_rss = 0

    @property
    def receiver(self):
        return receiver_of(self.service)

    def as_nobody(self, argv: list, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
                                cwd=self.attacker_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kwargs)

    def attack(self, start) -> tuple[list, subprocess.Popen]:
        """Run the attack ``start()`` (it returns the attacker's process) for ATTACK_S, checking
        the agent's promises throughout; the messages exported meanwhile and the attacker."""
        messages = self.capture.consumer.messages
        first = len(messages)
        peak = [rss()]
        stop = threading.Event()

        def watch_memory() -> None:
            while not stop.wait(0.1):
                peak[0] = max(peak[0], rss())

        watcher = threading.Thread(target=watch_memory, daemon=True)
        watcher.start()
        began = time.monotonic()
        attacker = start()
        try:
            time.sleep(ATTACK_S)
        finally:
            stop.set()
            watcher.join()
            attacker.kill()
            attacker.wait()
        window = time.monotonic() - began
        exported = messages[first:]
        # A report every interval (with its +/- jitter), none lost.
        assert len(exported) >= int(window / INTERVAL_S) - 2, (len(exported), window)
        for message in exported:
            leaves = {view.frames[0].function for view in iter_samples(message)
                      if view.resource.get("process.pid") == self.benign.pid and view.frames}
            assert "spin_heavy" in leaves, leaves
        assert peak[0] - self.idle_rss <= RSS_ALLOWANCE, (peak[0] - self.idle_rss) >> 20
        for message in messages:
            assert TOKEN.encode() not in message.SerializeToString(), "a root-only file's content was exported"
        return exported, attacker


    def attack_then_start(self, attacker_argv: list, newcomer_argv: list, delay_s: float = 2.0) -> tuple[list, subprocess.Popen, int]:
        """The attack by ``attacker_argv`` (as nobody), and ``delay_s`` into it a program of
        root's started (``newcomer_argv``): what was exported, the attacker, the newcomer's pid."""
        started: dict = {}

        def attacker_then_newcomer() -> subprocess.Popen:
            attacker = self.as_nobody(attacker_argv)
            time.sleep(delay_s)
            started["newcomer"] = subprocess.Popen(newcomer_argv, stdout=subprocess.DEVNULL)
            return attacker

        try:
            exported, attacker = self.attack(attacker_then_newcomer)
        finally:
            if "newcomer" in started:
                started["newcomer"].kill()
                started["newcomer"].wait()
        return exported, attacker, started["newcomer"].pid


def names_of(messages, pid: int) -> set[str]:
    return {frame.function for message in messages for view in iter_samples(message)
            if view.resource.get("process.pid") == pid for frame in view.frames if frame.function}


def roots_reaching_entry(messages, pid: int) -> collections.Counter:
    """Samples of ``pid`` whose stack reaches the C program's entry (True) and not (False)."""
    roots: collections.Counter = collections.Counter()
    for message in messages:
        for view in iter_samples(message):
            if view.resource.get("process.pid") == pid and view.frames:
                roots[view.frames[-1].function in ENTRY] += sum(view.values)
    return roots


def outermost_frames(messages, pid: int) -> collections.Counter:
    """Samples of ``pid`` by their outermost frame (function, or file and address unnamed)."""
    out: collections.Counter = collections.Counter()
    for message in messages:
        for view in iter_samples(message):
            if view.resource.get("process.pid") == pid and view.frames:
                frame = view.frames[-1]
                out[frame.function or f"{frame.mapping_filename}+{frame.address:#x}"] += sum(view.values)
    return out


def executable_names(messages, pid: int) -> set[str]:
    return {view.resource.get("process.executable.name") for message in messages for view in iter_samples(message)
            if view.resource.get("process.pid") == pid}


@pytest.fixture(scope="module")
def arena():
    yield from running_arena()


def running_arena(receiver_settings: dict | None = None):
    """The arena's set-up and tear-down (each module of attacks has an arena of its own), the
    profiling receiver's keys changed by ``receiver_settings``."""
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run attacks as another user")
    # Not under /tmp: one attack mounts its own /tmp in a namespace and must still see its program.
    root = Path(tempfile.mkdtemp(prefix="pycollector-hostile-", dir="/var/tmp"))
    root.chmod(0o755)
    (root / "attacker").mkdir()
    os.chown(root / "attacker", NOBODY, NOBODY)
    benign = compile_c((WORKLOADS / "known_split.c").read_text(), root / "benign", "-fno-omit-frame-pointer")
    spin = compile_c(SPIN_C.replace("NAME", "hostile_spin"), root / "spin", "-fno-omit-frame-pointer", "-no-pie")
    shutil.copy(spin, root / "spin-stripped")
    subprocess.run(["strip", "-s", str(root / "spin-stripped")], check=True)
    canary = root / "canary"  # root's alone: a perf map line and a debug file naming the attacker's code
    canary.write_text(f"401000 100000 {TOKEN}\n")
    canary.chmod(0o600)
    canary_elf = compile_c(SPIN_C.replace("NAME", TOKEN), root / "canary-elf", "-fno-omit-frame-pointer", "-no-pie")
    canary_elf.chmod(0o700)
    capture = CapturingExporterFactory()
    config = {
        # A row budget small enough for one attacker to want more than all of it.
        "receivers": {"profiling": {"samples_per_second": 99, "reporter_interval": f"{INTERVAL_S}s", "unwind_cache_dir": str(root / "cache"),
                                    "unwind_row_budget": ROW_BUDGET, **(receiver_settings or {})}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    running = subprocess.Popen([str(benign), "3600"], stdout=subprocess.DEVNULL)
    arena = Arena(root, service, capture, running)
    try:
        capture.consumer.wait_for(lambda consumer: "spin_heavy" in names_of(consumer.messages, running.pid), timeout=60)
        time.sleep(3 * INTERVAL_S)  # its files parsed, its rows built: the agent at rest
        arena.idle_rss = rss()
        yield arena
    finally:
        running.kill()
        running.wait()
        service.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def test_an_executable_path_that_is_not_utf8_blinds_nothing(arena):
    name = b"spin-\xff\xfe-\x1b[2J"
    path = os.path.join(bytes(arena.attacker_dir), name)
    shutil.copy(arena.root / "spin", path)
    os.chown(path, NOBODY, NOBODY)
    exported, attacker = arena.attack(lambda: arena.as_nobody([path, "60"]))
    assert any("\ufffd" in (name or "") for name in executable_names(exported, attacker.pid)), executable_names(exported, attacker.pid)
    assert "hostile_spin" in names_of(exported, attacker.pid)  # its own profile is fine too


def test_fifos_where_debug_files_and_perf_maps_are_looked_up_hang_nothing(arena):
    work, program = _stripped_program_with_a_debug_link(arena, "fifo")
    for fifo in (work / "spin.debug", work / ".debug" / "spin.debug"):
        os.mkfifo(fifo)
    for path in (work, work / ".debug", program, work / "spin.debug", work / ".debug" / "spin.debug"):
        os.chown(path, NOBODY, NOBODY)
    refused, symbolizer = dict(_files_stats()), arena.receiver.symbolizer
    symbols_before, loads_before = dict(symbolizer.stats), dict(symbolizer.loads.stats)
    exported, attacker = arena.attack(lambda: arena.as_nobody(["sh", "-c", f'mkfifo /tmp/perf-$$.map && exec {program} 60']))
    Path(f"/tmp/perf-{attacker.pid}.map").unlink(missing_ok=True)
    # (ci25 failed here once, the only time: what the agent had of the attacker, if it happens again)
    seen = {"samples": sum(sum(view.values) for message in exported for view in iter_samples(message) if view.resource.get("process.pid") == attacker.pid),
            "names": sorted(names_of(exported, attacker.pid))[:8], "executables": executable_names(exported, attacker.pid),
            "files": _changed(refused, _files_stats()), "symbols": _changed(symbols_before, symbolizer.stats),
            "loads": _changed(loads_before, symbolizer.loads.stats)}
    assert _files_stats()["not_regular"] > refused["not_regular"], f"the FIFOs were not even looked at: {seen}"


def test_a_debug_link_out_of_the_directory_is_not_followed(arena):
    work = arena.attacker_dir / "dotdot"
    work.mkdir()
    program = work / "spin"
    shutil.copy(arena.root / "spin-stripped", program)
    escape = b"../" * 12 + str(arena.root / "canary-elf").lstrip("/").encode()
    subprocess.run(["objcopy", f"--add-section=.gnu_debuglink={_file(work / 'link', debuglink_section(escape))}", str(program)], check=True)
    os.chown(program, NOBODY, NOBODY)
    exported, attacker = arena.attack(lambda: arena.as_nobody([str(program), "60"]))
    assert TOKEN not in names_of(exported, attacker.pid)


def test_a_giant_perf_map_without_a_newline_costs_a_bounded_read(arena):
    perf_maps = arena.receiver.jit.perf_maps
    before = dict(perf_maps.stats)
    program = arena.root / "spin-stripped"
    exported, attacker = arena.attack(lambda: arena.as_nobody(["sh", "-c", f"truncate -s 1G /tmp/perf-$$.map && exec {program} 60"]))
    Path(f"/tmp/perf-{attacker.pid}.map").unlink(missing_ok=True)
    assert perf_maps.stats["long_lines"] > before["long_lines"]


def test_perf_map_names_of_a_megabyte_are_dropped_and_long_ones_cut(arena):
    perf_maps = arena.receiver.jit.perf_maps
    before = dict(perf_maps.stats)
    work = arena.attacker_dir / "names"
    work.mkdir()
    os.chown(work, NOBODY, NOBODY)
    lines = b"".join(b"500000 10 " + b"m" * (1 << 20) + b"\n" for _ in range(3)) + b"401000 100000 " + b"L" * 5000 + b"\n"
    source = _file(work / "map", lines)
    os.chown(source, NOBODY, NOBODY)
    program = arena.root / "spin-stripped"
    exported, attacker = arena.attack(lambda: arena.as_nobody(["sh", "-c", f"cp {source} /tmp/perf-$$.map && exec {program} 60"]))
    Path(f"/tmp/perf-{attacker.pid}.map").unlink(missing_ok=True)
    names = names_of(exported, attacker.pid)
    cut = [name for name in names if name.startswith("LLLL")]
    changed = {key: value - before.get(key, 0) for key, value in perf_maps.stats.items() if value != before.get(key, 0)}
    assert cut and all(len(name) <= perf_maps.max_name_chars + len("…[truncated]") for name in cut), \
        ([len(n) for n in cut], sorted({name[:40] for name in names})[:8], changed)
    assert perf_maps.stats["long_lines"] >= before["long_lines"] + 3 and perf_maps.stats["names_truncated"] > before["names_truncated"]


def test_a_perf_map_bind_mounted_over_a_root_only_file_is_not_read(arena):
    program = arena.root / "spin-stripped"
    script = (f"mount -t tmpfs none /tmp && touch /tmp/perf-$$.map && mount --bind {arena.root / 'canary'} /tmp/perf-$$.map "
              f"&& exec {program} 60")
    # As a file root keeps writing (a log): newer than the process, so not refused as a stale map.
    future = time.time() + 3600
    os.utime(arena.root / "canary", (future, future))
    refused = _files_stats()["unreadable_by_process"]
    exported, attacker = arena.attack(lambda: arena.as_nobody(["unshare", "-Urm", "sh", "-c", script]))
    if attacker.returncode not in (0, -9) and b"unshare" in attacker.stderr.read():
        pytest.skip("unprivileged user namespaces are off here")
    assert TOKEN not in names_of(exported, attacker.pid)
    assert _files_stats()["unreadable_by_process"] > refused


def test_a_forged_build_id_lends_nobody_its_names_or_rows(arena):
    """The attacker's program carries the build id of a program root starts after it: that
    program's frames are still its own, and its stacks still reach main (its own unwind rows)."""
    build_id = "0x" + secrets.token_hex(20)
    forged = compile_c(SPIN_C.replace("NAME", "forged_spin"), arena.attacker_dir / "forged", "-fomit-frame-pointer", f"-Wl,--build-id={build_id}")
    os.chown(forged, NOBODY, NOBODY)
    victim = compile_c((WORKLOADS / "known_split.c").read_text(), arena.root / "victim", "-fomit-frame-pointer", f"-Wl,--build-id={build_id}")
    # (the forger profiled first: its file parsed and its rows built before the victim's)
    exported, forger, victim_pid = arena.attack_then_start([str(forged), "60"], [str(victim), "60"])
    assert "forged_spin" in names_of(exported, forger.pid)
    names = names_of(exported, victim_pid)
    assert "spin_heavy" in names and "forged_spin" not in names, names
    # (its first samples may come before its rows are loaded: walked by frame pointer, short)
    roots = roots_reaching_entry(exported, victim_pid)
    unwind = arena.receiver.unwind
    assert sum(roots.values()) > 50 and roots[True] / sum(roots.values()) > 0.8, (roots, unwind.stats)


# A frame chain of the program's own making: main's frame pointer leads to a frame whose return
# address lies beyond user space with bit 63 set, the mark of a Python frame among a stack's frames.
FORGED_CHAIN_C = r"""
static unsigned long forged_frame[2] = {0, 0x8000000000001230UL};
int main(void) {
    __asm__ volatile("mov %0, %%rbp\n1: pause\n jmp 1b" : : "r"(forged_frame) : "memory");
    return 0;
}
"""


def test_a_pid_the_attacker_leaves_to_a_root_program_names_neither_by_the_other(arena):
    """Issue 42, finding 6: the attacker's program spins and exits, and root's next program takes
    its pid (ns_last_pid) within the same report or the next. Each sample is named by its own
    process: linked at addresses the other's program does not map, neither's code may appear
    under the other's name or files (236 of 237 of root's samples were the attacker's program's)."""
    # Each program's code at an address of its own, which nothing else maps: not 0x400000, where
    # Debian's python3 (not PIE) is, and with it the Popen child that becomes root's program
    # until it execs (ci20 counted such a sample as the attacker's code).
    attacker_program = arena.attacker_dir / "pidreuse"
    shutil.copy(compile_c(SPIN_C.replace("NAME", "attacker_spin"), arena.root / "attacker-spin", "-fno-omit-frame-pointer", "-no-pie",
                          "-Wl,-Ttext-segment=0x30000000"),
                attacker_program)
    os.chown(attacker_program, NOBODY, NOBODY)
    root_program = compile_c(SPIN_C.replace("NAME", "rootside_spin"), arena.root / "rootreuse", "-fno-omit-frame-pointer", "-no-pie",
                             "-Wl,-Ttext-segment=0x20000000")
    attacker_text, root_text = range(0x30000000, 0x30400000), range(0x20000000, 0x20400000)

    def attacker_then_root() -> subprocess.Popen:
        attacker = arena.as_nobody([str(attacker_program), "1.5"])
        attacker.wait()
        # (Two seconds of it: the agent, on a host this busy, then catches up on its reports.)
        return spawn_with_pid(attacker.pid, [str(root_program), "2"])

    # Both programs run once first, so the attack's reports find their files read (a first report
    # that reads them takes seconds on a busy 2-core host, and the reports are checked to be on time).
    warm = [arena.as_nobody([str(attacker_program), "1"]), subprocess.Popen([str(root_program), "1"], stdout=subprocess.DEVNULL)]
    for process in warm:
        process.wait()
    time.sleep(2 * INTERVAL_S)
    exported, root = arena.attack(attacker_then_root)
    samples = collections.Counter()
    for message in exported:
        for view in iter_samples(message):
            if view.resource.get("process.pid") != root.pid:
                continue
            name = view.resource.get("process.executable.name")
            files = {os.path.basename(frame.mapping_filename) for frame in view.frames if frame.mapping_filename}
            functions = {frame.function for frame in view.frames}
            addresses = {frame.address for frame in view.frames if frame.frame_type == "native"}
            # Whose code it ran, by the addresses the kernel recorded; whose it was named, by the rest.
            ran = "root" if any(a in root_text for a in addresses) else "attacker" if any(a in attacker_text for a in addresses) else None
            named = "root" if name == "rootreuse" or "rootreuse" in files or "rootside_spin" in functions else None
            named_attacker = name == "pidreuse" or "pidreuse" in files or "attacker_spin" in functions
            assert not (named and named_attacker), (name, files, functions)
            samples[(ran, named or ("attacker" if named_attacker else None))] += sum(view.values)
    misnamed = {key: count for key, count in samples.items() if key[0] and key[1] and key[0] != key[1]}
    assert not misnamed, samples
    assert samples[("root", None)] == 0, samples  # root's code under another name (setpriv's, say)
    assert samples[("root", "root")] >= 20, samples


def test_a_forged_return_address_beyond_user_space_passes_for_no_python_frame(arena):
    """A frame chain that leads to a "return address" no user address can be (bit 63 set would
    pass for a Python frame): the unwinder stops there, and a stack the kernel walked is cut there,
    so the attacker's stacks hold no Python frame for the agent to read."""
    forged = compile_c(FORGED_CHAIN_C, arena.attacker_dir / "forged-chain", "-fno-omit-frame-pointer")
    os.chown(forged, NOBODY, NOBODY)
    exported, attacker = arena.attack(lambda: arena.as_nobody([str(forged)]))
    frames = [frame for message in exported for view in iter_samples(message)
              if view.resource.get("process.pid") == attacker.pid for frame in view.frames]
    assert frames, "the attacker was sampled"
    assert {frame.frame_type for frame in frames} <= {"native", "kernel"}, collections.Counter(frame.frame_type for frame in frames)
    assert "main" in {frame.function for frame in frames}
    # Whether the unwinder stopped there itself (counted) is asked of a receiver of its own below:
    # here, after the module's other attacks, the count did not come in whole-suite runs (see
    # the note of session 17), while the stacks above held no Python frame all the same.


def test_a_debug_file_behind_a_directory_the_attacker_cannot_search_is_not_read(arena):
    """The attacker's stripped program names, through its debug link and a symlink, a debug file
    with its build id that lies in a directory only root may search. The file itself is open to
    all (mode 0644): only the walk as the attacker shows it cannot be reached."""
    build_id = "0x" + secrets.token_hex(20)
    closed = arena.root / "closed"
    closed.mkdir(mode=0o700)
    canary = compile_c(SPIN_C.replace("NAME", TOKEN), closed / "canary.debug", "-fno-omit-frame-pointer", "-no-pie", f"-Wl,--build-id={build_id}")
    canary.chmod(0o644)
    work = arena.attacker_dir / "closed-link"
    work.mkdir()
    program = compile_c(SPIN_C.replace("NAME", "hostile_spin"), work / "spin", "-fno-omit-frame-pointer", "-no-pie", f"-Wl,--build-id={build_id}")
    subprocess.run(["strip", "-s", str(program)], check=True)
    subprocess.run(["objcopy", f"--add-section=.gnu_debuglink={_file(work / 'link', debuglink_section(b'spin.debug'))}", str(program)], check=True)
    (work / "spin.debug").symlink_to(canary)
    for path in (work, program):
        os.chown(path, NOBODY, NOBODY)
    os.lchown(work / "spin.debug", NOBODY, NOBODY)
    refused = _files_stats()["unreadable_by_process"]
    exported, attacker = arena.attack(lambda: arena.as_nobody([str(program), "60"]))
    assert TOKEN not in names_of(exported, attacker.pid)
    assert _files_stats()["unreadable_by_process"] > refused


# Mounts a FUSE file system whose daemon never answers (not even its INIT) over the attacker's
# /tmp and over the .debug directory beside its program, keeping the device open, then becomes
# the program: every perf map and debug file lookup of the agent walks into that mount.
SILENT_FUSE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
device = os.open("/dev/fuse", os.O_RDWR)
for target in sys.argv[2:]:
    options = f"fd={device},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"silent", target.encode(), b"fuse", 0, options) != 0:
        sys.exit("mount: " + os.strerror(ctypes.get_errno()))
os.set_inheritable(device, True)
os.execv(sys.argv[1], [sys.argv[1], "60"])
"""


def test_a_fuse_mount_that_never_answers_hangs_nothing(arena):
    work, program = _stripped_program_with_a_debug_link(arena, "fuse")
    for path in (work, work / ".debug", program):
        os.chown(path, NOBODY, NOBODY)
    refused = _files_stats()["unreadable_by_process"]
    exported, attacker = arena.attack(lambda: arena.as_nobody(
        ["unshare", "-Urm", "/usr/bin/python3", "-c", SILENT_FUSE, str(program), "/tmp", str(work / ".debug")]))
    if attacker.returncode not in (0, -9):
        error = attacker.stderr.read()
        if b"unshare" in error or b"mount:" in error:
            pytest.skip(f"no FUSE mount in a user namespace here: {error.decode(errors='replace')}")
    assert attacker.pid in {view.resource.get("process.pid") for message in exported for view in iter_samples(message)}
    # The kernel refuses the agent at the mount (it is not of the mount's user namespace)
    # before any request reaches the daemon.
    assert _files_stats()["unreadable_by_process"] > refused


def test_memory_a_silent_fuse_daemon_serves_is_not_read(arena):
    """The attacker maps a file of a FUSE file system it serves itself, stops answering reads,
    and points its process context's payload there: reading it would fault the page in and wait
    for that daemon for ever (the events thread first, then every report behind the process
    table). The file system is mounted as fusermount mounts a user's: by root, in the host's
    namespaces, for that user (no allow_other), its descriptor handed to the user's daemon. (One a
    user namespace mounts cannot take the agent's requests at all: root is not one of its ids.)"""
    import ctypes

    work = arena.attacker_dir / "fuse-memory"
    work.mkdir()
    os.chown(work, NOBODY, NOBODY)
    device = os.open("/dev/fuse", os.O_RDWR)
    options = f"fd={device},rootmode=40000,user_id={NOBODY},group_id={NOBODY}".encode()
    if ctypes.CDLL(None, use_errno=True).mount(b"hostile", bytes(work), b"fuse", 0, options) != 0:
        os.close(device)
        pytest.skip(f"cannot mount FUSE here: {os.strerror(ctypes.get_errno())}")
    script = Path(__file__).with_name("fuse_mapped_context.py")
    contexts = arena.receiver.contexts
    errors = contexts.stats["errors"]
    contexts.rescan_s = 0.5  # (it publishes after its first samples: look again within the attack)
    try:
        exported, attacker = arena.attack(lambda: arena.as_nobody(["/usr/bin/python3", str(script), str(work), str(device)],
                                                                  pass_fds=(device,)))
    finally:
        contexts.rescan_s = 10.0
        os.close(device)
        subprocess.run(["umount", "-l", str(work)], check=False)
    assert attacker.pid in {view.resource.get("process.pid") for message in exported for view in iter_samples(message)}
    assert contexts.stats["errors"] > errors  # the payload's read was refused, not waited for


# Runs in libLLVM (path: argv[1]) for good: its rows take a helper process seconds to build.
IN_LLVM_PY = """
import ctypes, sys
llvm = ctypes.CDLL(sys.argv[1])
llvm.LLVMContextCreate.restype = ctypes.c_void_p
llvm.LLVMContextDispose.argtypes = [ctypes.c_void_p]
while True:
    llvm.LLVMContextDispose(llvm.LLVMContextCreate())
"""


def test_a_process_that_runs_in_more_libraries_than_the_row_budget_holds_leaves_room(arena):
    """The attacker runs, busy and for good, in 16 libraries of 12k rows each: more than the
    whole budget, and in libLLVM, whose rows take seconds to build. A program root starts
    meanwhile in its own copy of that library still has its rows: its stacks reach main. (ci3 of
    session 28 failed here, 0 of 183 samples reaching main: a library of the host's was being
    built, and the newcomer's waited behind it.)"""
    from tests.test_profiling_row_budget import LIBRARY_C, RUNNER_C

    work = arena.attacker_dir / "rows"
    work.mkdir()
    (work / "library.c").write_text(LIBRARY_C)
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-fomit-frame-pointer", "-o", str(work / "library-0.so"), str(work / "library.c")], check=True)
    runner = compile_c(RUNNER_C, work / "runner", "-fno-omit-frame-pointer", "-ldl")
    libraries = [work / f"library-{copy}.so" for copy in range(16)]
    for library in libraries[1:]:
        shutil.copy(libraries[0], library)
    shutil.copy(libraries[0], arena.root / "library-victim.so")
    for path in (work, *libraries):
        os.chown(path, NOBODY, NOBODY)
    unwind = arena.receiver.unwind
    in_llvm = arena.as_nobody(["/usr/bin/python3", "-c", IN_LLVM_PY, _libllvm()])
    try:
        _wait_for_a_build_of(unwind, arena.receiver.processes, in_llvm.pid, "/libLLVM")
        exported, hog, victim_pid = arena.attack_then_start([str(runner), "60", "0", *map(str, libraries)],
                                                            [str(runner), "60", "0", str(arena.root / "library-victim.so")])
    finally:
        in_llvm.kill()
        in_llvm.wait()
    assert unwind.stats["row_budget_exhausted"] + unwind.stats["files_waiting_for_room"] > 0, unwind.stats  # short indeed
    roots = roots_reaching_entry(exported[-3:], victim_pid)  # once its rows had time to load
    # (What a failure needs told, printed whole: ci3 of session 28 failed here once, 0 of 183
    # samples reaching main, not reproduced in 8 runs since, with and without two CPU hogs.)
    print("the newcomer's samples by report, reaching main / not:",
          [(roots_reaching_entry([message], victim_pid)[True], roots_reaching_entry([message], victim_pid)[False]) for message in exported])
    print("the newcomer's outermost frames, last three reports:", outermost_frames(exported[-3:], victim_pid).most_common(6))
    print("unwind:", unwind.stats)
    with unwind._lock:  # (whether the newcomer's library waits for room, and what room there is: one range must hold it)
        held, share, info = unwind._rows_held(), unwind._share(), arena.receiver.processes.lookup(victim_pid)
        print("the newcomer's files:", {mapping.path.rsplit("/", 1)[-1]: getattr(unwind._files.get(mapping.identity), "state", None)
                                         for mapping in (info.mappings if info else []) if mapping.file_backed})
        print("share", round(share), "held by the newcomer", round(held.get(victim_pid, 0)), "over their share", {pid: round(rows) for pid, rows in held.items() if rows > share},
              "free", unwind._space.free, "largest free range", unwind._space.largest, "of", unwind._space.size)
    print("sampler:", {name: value for name, value in arena.receiver._sampler.counters().items() if name.startswith("unwind_") and value})
    assert roots[True] + roots[False] > 50, roots
    assert roots[True] / (roots[True] + roots[False]) > 0.9, roots


def _wait_for_a_build_of(unwind, processes, pid: int, name: str) -> None:
    """Until the rows of ``pid``'s file named ``name`` are being built (taken from the queue)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = processes.lookup(pid)
        key = next((mapping.identity for mapping in (info.mappings if info else []) if name in mapping.path), None)
        with unwind._lock:
            if key is not None and getattr(unwind._files.get(key), "state", None) == "queued" and key not in unwind._pending:
                return
        time.sleep(0.05)
    raise AssertionError(f"no build of {name} began for process {pid}: {unwind.stats}")


def _libllvm() -> str:
    """The libLLVM this process maps (BCC's compiler)."""
    with open("/proc/self/maps") as maps:
        return next(line.split(None, 5)[5].strip() for line in maps if "/libLLVM" in line)


# A Python program whose code objects are as large as it can make the reader keep them: names of
# 100k characters and line tables just under the 64 KiB a table may have (a larger one is not
# read), 600 of them (more than the cache holds), called 50 deep so that every sample holds 50.
FAT_CODE = r"""
import sys
N, DEPTH = 600, 50
functions = []
namespace = {"F": functions}
for i in range(N):
    exec("def f%d(depth, k):\n    if depth:\n        return F[(k + 1) %% %d](depth - 1, k + 1)\n"
         "    s = 0\n    for j in range(2000):\n        s += j\n    return s\n" % (i, N), namespace)
    code = namespace["f%d" % i].__code__
    function = namespace["f%d" % i]
    function.__code__ = code.replace(co_name="n%d" % i + "n" * 100_000, co_qualname="q" * 100_000,
                                     co_linetable=code.co_linetable + b"\x80" * 60_000)
    functions.append(function)
k = 0
while True:
    functions[k % N](DEPTH, k)
    k += 7
"""


def test_a_python_program_with_giant_code_objects_is_read_within_budget(arena):
    code = arena.receiver.python.code
    before = dict(code.stats)
    exported, attacker = arena.attack(lambda: arena.as_nobody(["/usr/bin/python3.11", "-c", FAT_CODE]))
    names = names_of(exported, attacker.pid)
    assert any(name.endswith("…[truncated]") for name in names), (sorted(name[:40] for name in names if name[:1] in "nq<"), code.stats)
    assert all(len(name) <= 1024 + len("…[truncated]") for name in names)
    assert code.held_bytes <= code.max_bytes
    assert code.stats["read_budget_spent"] + code.stats["evicted"] > before["read_budget_spent"] + before["evicted"], code.stats


# Forks 300 children that each run a moment and then wait; all share their parent's command line
# of 1.5 MB (15 arguments of 100 KB: no argument may pass 128 KB).
FORKER_C = r"""
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(void) {
    for (int i = 0; i < 300; i++) {
        if (fork() == 0) {
            double end = now() + 0.03;
            while (now() < end) sink++;
            sleep(8);
            _exit(0);
        }
        usleep(10000);
    }
    sleep(60);
    return 0;
}
"""


def test_300_children_with_a_giant_command_line_cost_bounded_memory(arena):
    forker = compile_c(FORKER_C, arena.attacker_dir / "forker")
    os.chown(forker, NOBODY, NOBODY)
    arguments = ["a" * 100_000 for _ in range(15)]
    exported, attacker = arena.attack(lambda: arena.as_nobody([str(forker), *arguments]))
    children = {view.resource.get("process.pid") for message in exported for view in iter_samples(message)
                if view.resource.get("process.executable.name") == "forker"} - {attacker.pid}
    assert len(children) > 100, len(children)  # seen, with their command lines, and memory stayed within its allowance


def _stripped_program_with_a_debug_link(arena: Arena, name: str) -> tuple[Path, Path]:
    """A directory of the attacker's with a .debug directory and a copy of the stripped spin
    program whose debug link names spin.debug (looked up beside it, then in .debug/)."""
    work = arena.attacker_dir / name
    work.mkdir()
    program = work / "spin"
    shutil.copy(arena.root / "spin-stripped", program)
    subprocess.run(["objcopy", f"--add-section=.gnu_debuglink={_file(work / 'link', debuglink_section(b'spin.debug'))}", str(program)], check=True)
    (work / ".debug").mkdir()
    return work, program


def _file(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    path.chmod(stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    return path


def _changed(before: dict, after: dict) -> dict:
    return {name: value - before.get(name, 0) for name, value in after.items() if isinstance(value, int) and value != before.get(name, 0)}


def _files_stats() -> dict:
    from receivers.profiling.processes import files

    return dict(files.stats)


# Last in the module: it runs a receiver of its own in this process, whose memory would count
# against the arena's agent in the attacks after it.
def test_the_unwinder_stops_at_a_forged_return_address_and_counts_it(tmp_path):
    """The same forged chain under a receiver of its own: the unwinder, which has the program's
    rows (its frame pointer chain leads it to the forged return address), stops there and
    counts it."""
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    forged = compile_c(FORGED_CHAIN_C, tmp_path / "forged-chain", "-fno-omit-frame-pointer")
    service, _ = capturing_service(tmp_path, 199)
    service.start()
    program = None
    try:
        counters = receiver_of(service)._sampler.counters
        stopped = counters()["unwind_not_user_address"]
        program = subprocess.Popen([str(forged)])
        deadline = time.monotonic() + 15
        while counters()["unwind_not_user_address"] <= stopped and time.monotonic() < deadline:
            time.sleep(0.2)
        counted = counters()["unwind_not_user_address"] - stopped
        unwind = {key: value for key, value in counters().items() if key.startswith("unwind")}
        stats = dict(receiver_of(service).unwind.stats)
    finally:
        if program is not None:
            program.kill()
            program.wait()
        service.shutdown()
    assert counted > 0, (unwind, stats)
