"""PerfMaps: perf map files read through a process's root, appended, replaced and rewritten; the
maps real Node.js and JVM processes write; the runtime a process's mappings tell."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from receivers.profiling.jit import perfmap
from receivers.profiling.jit.jvm_attach import run_jcmd
from receivers.profiling.jit.perfmap import (
    PerfMaps,
    jit_runtime,
    parse_line,
    process_identity,
    process_jit_runtime,
)
from receivers.profiling.processes.table import ProcessTable
from tests.conftest import WORKLOADS

NSPID = 4242  # the fake process's pid "inside its namespace": the file is tmp/perf-4242.map


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replay(lines: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The convention, naively: each line removes the ranges it overlaps."""
    out: list[tuple[int, int, str]] = []
    for s, e, name in lines:
        out = [o for o in out if o[1] <= s or o[0] >= e]
        out.append((s, e, name))
    return out


def answer(ranges: list[tuple[int, int, str]], addr: int) -> tuple[str, int] | None:
    hits = [(name, s) for s, e, name in ranges if s <= addr < e]
    assert len(hits) <= 1
    return hits[0] if hits else None


def map_lines(path: Path) -> list[tuple[int, int, str]]:
    """The complete lines of a perf map as they are now."""
    data = path.read_bytes()
    return [e for e in map(parse_line, data[: data.rfind(b"\n") + 1].splitlines()) if e]


@pytest.fixture
def fake(tmp_path):
    """A fake root holding tmp/perf-4242.map, PerfMaps on a fake clock, and lookup(addr)."""
    (tmp_path / "tmp").mkdir()
    clock = Clock()
    maps = PerfMaps(clock=clock, refresh_interval_s=1.0, max_age_s=10.0)

    def lookup(addr):  # our own pid: a real /proc/PID/status gives the uids
        return maps.lookup(os.getpid(), addr, root=str(tmp_path), nspid=NSPID)

    return tmp_path / "tmp" / f"perf-{NSPID}.map", clock, maps, lookup


@pytest.mark.parametrize("line, expected", [
    (b"7f3a00001000 40 JS:*spinHeavy /a/b.js:6:19", (0x7F3A00001000, 0x7F3A00001040, "JS:*spinHeavy /a/b.js:6:19")),
    (b"0x00007f90b8ec7620 0x0000000000000158 long KnownSplit.spinHeavy(long)",
     (0x7F90B8EC7620, 0x7F90B8EC7778, "long KnownSplit.spinHeavy(long)")),
    (b"10 1 a  b\tc \r", (0x10, 0x11, "a  b\tc")),  # inner spaces kept, the line end stripped
    (b"1000 10", None),  # no name
    (b"zz 10 f", None),
    (b"1000 0 f", None),  # empty range
    (b"-10 10 f", None),
    (b"", None),
])
def test_parse_line(line, expected):
    assert parse_line(line) == expected


def test_reads_through_the_root_and_follows_appends(fake):
    path, clock, maps, lookup = fake
    path.write_text("1000 100 first\n0x2000 0x100 second one\nnot a line\n3000 80 third\n")
    assert lookup(0x1000) == ("first", 0x1000)
    assert lookup(0x10FF) == ("first", 0x1000)
    assert lookup(0x1100) is None
    assert lookup(0x20FF) == ("second one", 0x2000)
    assert lookup(0xFFF) is None
    assert maps.stats["malformed_lines"] == 1 and maps.stats["lines"] == 4
    assert maps.stats["files_read"] == 1

    # Appended: one line replaces 0x1000 (overlapping its end), one is new, one not finished.
    with path.open("a") as f:
        f.write("1080 100 moved\n5000 10 new\n6000 10 half")
    clock.now += 0.5  # too soon after the last check: the file is not looked at
    assert lookup(0x5000) is None
    assert lookup(0x1000) == ("first", 0x1000)
    clock.now += 0.6  # a miss may check now
    assert lookup(0x5000) == ("new", 0x5000)
    assert maps.stats["appends_read"] == 1
    assert lookup(0x1000) is None  # the whole older range went, not just the overlapped part
    assert lookup(0x1080) == ("moved", 0x1080)
    assert lookup(0x117F) == ("moved", 0x1080)
    assert lookup(0x6000) is None  # its line has no newline yet

    with path.open("a") as f:
        f.write(" done\n")
    clock.now += 1.0
    assert lookup(0x6000) == ("half done", 0x6000)
    assert maps.stats["lines"] == 7 and maps.stats["entries_replaced"] == 1

    # A hit does not check until max_age_s: a range rewritten under a hit keeps its old name.
    with path.open("a") as f:
        f.write("2000 100 second again\n")
    clock.now += 5.0
    assert lookup(0x2000) == ("second one", 0x2000)
    clock.now += 5.0
    assert lookup(0x2000) == ("second again", 0x2000)

    # Replaced by a smaller file (a new inode): read from the start, the old ranges gone.
    before = maps.stats["files_read"]
    new = path.with_suffix(".new")
    new.write_text("9000 10 only\n")
    os.replace(new, path)
    clock.now += 1.0
    assert lookup(0x9000) == ("only", 0x9000)
    assert maps.stats["files_read"] == before + 1
    assert lookup(0x1080) is None and lookup(0x3000) is None
    assert maps.entries(os.getpid()) == 1

    maps.forget(os.getpid())
    assert maps.entries(os.getpid()) == 0


def test_rewritten_in_place_is_read_again(fake):
    """A JVM truncates and rewrites the same file (same inode), maybe longer than before."""
    path, clock, maps, lookup = fake
    path.write_text("1000 100 old.a()\n2000 100 old.b()\n")
    ino = path.stat().st_ino
    assert lookup(0x1000) == ("old.a()", 0x1000)
    with path.open("w") as f:  # longer now: a plain append would read from the middle
        f.write("1000 80 new.a()\n3000 100 new.c()\n4000 100 new.d()\n")
    assert path.stat().st_ino == ino
    clock.now += 1.0
    assert lookup(0x3000) == ("new.c()", 0x3000)
    assert lookup(0x1000) == ("new.a()", 0x1000)
    assert lookup(0x2000) is None
    assert maps.stats["files_read"] == 2 and maps.stats["appends_read"] == 0

    # Same size, and the same last bytes (the appended check looks at 64): told by the mtime.
    long = "3000 100 " + "x" * 80 + "\n"
    path.write_text("1000 80 new.p()\n" + long)
    clock.now += 10.0
    assert lookup(0x1000) == ("new.p()", 0x1000)
    st = path.stat()
    path.write_text("1000 80 new.q()\n" + long)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a coarse clock: make sure
    assert path.stat().st_size == st.st_size
    clock.now += 10.0
    assert lookup(0x1000) == ("new.q()", 0x1000)

    # Shrunk in place: read from the start.
    path.write_text("5000 10 small\n")
    clock.now += 1.0
    assert lookup(0x5000) == ("small", 0x5000)
    assert lookup(0x3000) is None


def test_missing_file_is_looked_for_again(fake):
    path, clock, maps, lookup = fake
    assert lookup(0x1000) is None  # a JVM before jcmd: no file yet
    path.write_text("1000 10 late\n")
    assert lookup(0x1000) is None
    clock.now += 1.0
    assert lookup(0x1000) == ("late", 0x1000)
    path.unlink()  # gone (someone cleaned /tmp): the code is still there, so are its names
    clock.now += 10.0
    assert lookup(0x1000) == ("late", 0x1000)


def test_refuses_fifos_symlinks_stale_files_and_files_of_others(tmp_path):
    (tmp_path / "tmp").mkdir()

    def lookup(name, write=None, make=None, started_ns=None):
        path = tmp_path / "tmp" / f"perf-{name}.map"
        if write is not None:
            path.write_text(write)
        if make is not None:
            make(path)
        maps = PerfMaps()
        found = maps.lookup(os.getpid(), 0x1000, root=str(tmp_path), nspid=name,
                            started_ns=started_ns)
        return found, maps.stats["files_refused"]

    assert lookup(1, make=os.mkfifo) == (None, 1)  # reading it would block: never read
    real = tmp_path / "elsewhere.map"
    real.write_text("1000 10 planted\n")
    assert lookup(2, make=lambda p: os.symlink(real, p)) == (None, 1)
    # Older than the process: left by an earlier process with the same pid.
    now = time.time_ns()
    assert lookup(3, "1000 10 stale\n", started_ns=now + 60_000_000_000) == (None, 1)
    assert lookup(4, "1000 10 fresh\n", started_ns=now - 1_000_000_000) == (("fresh", 0x1000), 0)
    if os.geteuid() == 0:  # owned by a user the process is not (nor root): refused, as perf does
        assert lookup(5, "1000 10 theirs\n", make=lambda p: os.chown(p, 54321, 54321)) == (None, 1)
    else:  # our own file
        assert lookup(5, "1000 10 mine\n") == (("mine", 0x1000), 0)


@pytest.mark.parametrize("merge", ["range by range", "one sweep"])
def test_cap_drops_new_ranges_but_still_removes_the_ones_they_replace(fake, monkeypatch, merge):
    path, clock, _maps, _lookup = fake
    monkeypatch.setattr(perfmap, "_FEW", 10**9 if merge == "range by range" else 0)
    maps = PerfMaps(clock=clock, max_entries=3)

    def lookup(addr):
        return maps.lookup(os.getpid(), addr, root=str(path.parent.parent), nspid=NSPID)

    path.write_text("".join(f"{0x1000 * (i + 1):x} 100 f{i}\n" for i in range(5)))
    assert lookup(0x1000) == ("f0", 0x1000)
    assert lookup(0x3000) == ("f2", 0x3000)
    assert lookup(0x4000) is None  # over the cap
    assert maps.stats["entries_dropped"] == 2 and maps.entries(os.getpid()) == 3
    with path.open("a") as f:
        f.write("1000 10 g0\n7000 10 g1\n")
    clock.now += 1.0
    assert lookup(0x7000) is None  # full
    assert lookup(0x1000) == ("g0", 0x1000)  # it replaced f0, so there was room for it
    assert lookup(0x1050) is None  # f0's rest is not named f0 any more
    assert maps.stats["entries_dropped"] == 3


def test_what_the_maps_hold_is_counted_in_the_bytes_their_objects_take(tmp_path):
    """Issue 42: the budget counts each range's objects, not only its name's characters. Eight
    processes' maps of 20,000 ranges each, under a 1 MiB cap for all: the index grows by about
    the cap (tracemalloc), where counting characters alone let it grow to ~17 MB (60,000 ranges
    each under 4 MiB: 51 MB)."""
    import gc
    import tracemalloc

    (tmp_path / "tmp").mkdir()
    lines = "".join(f"{0x7F0000000000 + i * 0x100:x} 80 LazyCompile:*handler /srv/app/routes.js:{i}\n" for i in range(20_000))
    cap = 1 << 20
    maps = PerfMaps(max_total_bytes=cap, max_map_bytes=cap, max_read_bytes=64 << 20, max_read_lines=1 << 30,
                    max_read_bytes_per_second=1 << 40, max_read_lines_per_report=1 << 40)
    identity = process_identity(os.getpid())[1]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for nspid in range(100, 108):
            (tmp_path / "tmp" / f"perf-{nspid}.map").write_text(lines)
            maps.lookup(nspid, 0x7F0000000000, root=str(tmp_path), nspid=nspid, credentials=identity)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert maps.held_bytes() <= cap
    assert held <= cap * 1.25 + (256 << 10), held
    assert maps.held_bytes() >= held * 0.75, (maps.held_bytes(), held)  # (what it counts is what they cost)
    assert maps.stats["entries_dropped"] > 0
    assert maps.lookup(100, 0x7F0000000000 + 0x100) == ("LazyCompile:*handler /srv/app/routes.js:1", 0x7F0000000100)
    for nspid in range(100, 108):
        maps.forget(nspid)
    assert maps.held_bytes() == 0


@pytest.mark.parametrize("merge", ["range by range", "one sweep"])
def test_overlapping_lines_match_a_naive_replay(fake, monkeypatch, merge):
    """Random, heavily overlapping ranges, read in three batches: each answer is what replaying
    the lines one by one gives.  Both ways of merging a batch are checked."""
    map_path, clock, maps, lookup = fake
    monkeypatch.setattr(perfmap, "_FEW", 10**9 if merge == "range by range" else 0)
    rng = random.Random(7)
    lines = [(s, s + rng.randrange(1, 0x300), f"f{i}")
             for i, s in enumerate(rng.randrange(0, 0x4000) for _ in range(600))]
    for upto in (200, 400, 600):
        with map_path.open("a") as f:
            f.writelines(f"{s:x} {e - s:x} {n}\n" for s, e, n in lines[upto - 200:upto])
        clock.now += 1.0
        maps.lookup(os.getpid(), -1, root=str(map_path.parent.parent), nspid=NSPID)  # a miss: check
        expected = replay(lines[:upto])
        for addr in range(0, 0x4400, 7):
            assert lookup(addr) == answer(expected, addr), hex(addr)
        assert maps.entries(os.getpid()) == len(expected)


def test_process_identity():
    nspid, credentials = process_identity(os.getpid())
    status = Path("/proc/self/status").read_text()
    assert nspid == int(next(x for x in status.splitlines() if x.startswith("NSpid:")).split()[-1])
    assert credentials.fsuid == os.geteuid() and credentials.fsgid == os.getegid()
    assert process_identity(2**22 + 12345) == (2**22 + 12345, None)  # no such process


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_container_file_is_read_through_its_root_with_its_own_pid():
    """A process in its own pid and mount namespaces (its own tmpfs on /tmp) writes its map as
    pid 1; the host has no such file.  Found through /proc/PID/root with NSpid's pid."""
    script = ("mount -t tmpfs none /tmp && printf '1000 10 inside fn\\n' > /tmp/perf-$$.map "
              "&& echo ready && exec sleep 30")
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount", "sh", "-c", script],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        (pid,) = _children(proc.pid)
        assert process_identity(pid)[0] == 1
        maps = PerfMaps()
        assert maps.lookup(pid, 0x1005) == ("inside fn", 0x1000)
        assert maps.lookup(pid, 0x1010) is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("exe, paths, expected", [
    ("/usr/bin/node", ["/usr/lib/x86_64-linux-gnu/libc.so.6"], "v8js"),
    ("/usr/bin/nodejs", [], "v8js"),
    ("/opt/app/server", ["/usr/lib/x86_64-linux-gnu/libnode.so.108"], "v8js"),
    ("/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
     ["/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"], "jvm"),
    ("/opt/app/launcher", ["/opt/jdk/lib/server/libjvm.so"], "jvm"),  # an embedded JVM
    ("/usr/bin/java", [], None),  # the launcher alone says nothing: libjvm not mapped yet
    ("/usr/bin/python3.11", ["/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"], None),
    (None, [], None),
])
def test_jit_runtime(exe, paths, expected):
    assert jit_runtime(exe, paths) == expected


# --------------------------------------------------------------------------------------------
# Real runtimes


def _named(ranges: list[tuple[int, int, str]], *patterns: str) -> list[tuple[int, int, str]]:
    return [r for r in ranges if any(p in r[2] for p in patterns)]


def _check_ranges(maps: PerfMaps, pid: int, ranges: list[tuple[int, int, str]], path: Path) -> None:
    """Each range is named from its first to its last byte, and not past it (unless a range the
    file holds starts there)."""
    for start, end, name in ranges:
        assert maps.lookup(pid, start) == (name, start)
        assert maps.lookup(pid, end - 1) == (name, start)
        after = maps.lookup(pid, end)
        if after is not None:
            assert after[1] >= end
            assert any(s == after[1] and n == after[0] and s <= end < e for s, e, n in map_lines(path))


def _wait_for(path: Path, pattern: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and pattern in path.read_bytes():
            return
        time.sleep(0.1)
    raise AssertionError(f"no {pattern} in {path} after {timeout} s")


@pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")
def test_node_perf_basic_prof(tmp_path):
    # cwd: node also writes an isolate-*-v8.log into its working directory
    proc = subprocess.Popen(["node", "--perf-basic-prof", str(WORKLOADS / "known_split.js"), "3"],
                            stdout=subprocess.DEVNULL, cwd=tmp_path)
    path = Path(f"/tmp/perf-{proc.pid}.map")
    try:
        _wait_for(path, b"JS:*spinHeavy", 2.5)  # optimized code appears well within a second
        ranges = replay(map_lines(path))  # before PerfMaps reads: it will know all of these
        maps = PerfMaps()
        info = ProcessTable().snapshot(proc.pid)
        assert process_jit_runtime(info) == "v8js"
        assert maps.lookup_process(info, 0) is None  # reads the file now
        heavy = _named(ranges, "spinHeavy")
        assert any("JS:*spinHeavy" in name for _s, _e, name in heavy)
        others = _named(ranges, "spinLight", "runOnce", "Builtin:ArrayPrototypePush")
        assert len(others) >= 3
        _check_ranges(maps, proc.pid, heavy + others, path)
        # Optimized code lives in anonymous memory: no ELF symbol could name it.
        start = next(s for s, _e, name in heavy if "JS:*" in name)
        mapping = info.find_mapping(start)
        assert mapping is not None and mapping.inode == 0 and not mapping.path
        assert maps.stats["malformed_lines"] == 0 and maps.stats["files_refused"] == 0
    finally:
        proc.kill()
        proc.wait()
        path.unlink(missing_ok=True)  # node leaves it behind


@pytest.mark.skipif(not shutil.which("javac"), reason="no JDK")
def test_jvm_compiler_perfmap_through_the_attach_socket(tmp_path):
    subprocess.run(["javac", "-d", str(tmp_path), str(WORKLOADS / "KnownSplit.java")], check=True)
    proc = subprocess.Popen(["java", "-cp", str(tmp_path), "KnownSplit", "8"], stdout=subprocess.DEVNULL)
    path = Path(f"/proc/{proc.pid}/root/tmp/perf-{proc.pid}.map")
    try:
        time.sleep(1.5)  # spinHeavy is compiled by then
        clock = Clock()
        maps = PerfMaps(clock=clock)
        info = ProcessTable().snapshot(proc.pid)
        assert process_jit_runtime(info) == "jvm"
        assert maps.lookup_process(info, 0) is None  # nothing before the request
        assert maps.stats["files_read"] == 0

        run_jcmd(proc.pid, "Compiler.perfmap")
        lines = map_lines(path)
        assert path.read_bytes().startswith(b"0x")  # 0x%016lx 0x%016lx name
        ranges = replay(lines)
        heavy = _named(ranges, "KnownSplit.spinHeavy")
        assert heavy and all(name == "long KnownSplit.spinHeavy(long)" for _s, _e, name in heavy)
        others = _named(ranges, "KnownSplit.spinLight", "KnownSplit.runOnce")
        assert len(others) >= 2
        clock.now += 1.0
        _check_ranges(maps, proc.pid, heavy + others, path)
        assert maps.stats["files_read"] == 1 and maps.stats["lines"] == len(lines)

        # A second request rewrites the same file in place: it is read again, from the start.
        ino = path.stat().st_ino
        time.sleep(0.5)
        run_jcmd(proc.pid, "Compiler.perfmap")
        assert path.stat().st_ino == ino
        clock.now += 10.0
        ranges = replay(map_lines(path))
        _check_ranges(maps, proc.pid, _named(ranges, "KnownSplit."), path)
        assert maps.stats["files_read"] + maps.stats["appends_read"] == 2
        assert maps.entries(proc.pid) == len(ranges)
    finally:
        proc.kill()
        proc.wait()
        Path(f"/tmp/perf-{proc.pid}.map").unlink(missing_ok=True)
