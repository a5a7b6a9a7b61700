"""Attacks on what the agent spends, by an ordinary user's processes (issue 42, "budgets that
hold for the whole agent"): long /proc/PID/maps, perf maps of a million lines, files crafted to
make parsers walk forever, JVMs that stay starting.

The arena is test_hostile_host's (the agent in this process, root, reporting every second; a
benign busy program beside every attack; the attacker user nobody), with the same promises
checked throughout each attack: a report every interval with the benign process named in it,
resident memory within 64 MiB of the agent's at rest before this module's attacks, no byte of a
root-only canary exported. A module of its own, so that its agent's memory is measured from its
own start: what the agent keeps of the other module's attacks (caches of their files) is not
charged to these.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pycollector.pdata import iter_samples

from tests.conftest import wait_for
from tests.test_hostile_host import ATTACK_S, NOBODY, Arena, _file, compile_c, names_of, running_arena

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module")
def arena():
    yield from running_arena()


def test_six_processes_with_perf_maps_of_a_million_lines_cost_bounded_memory(arena):
    """Issue 42: six processes of the attacker, each with its own link to a 64 MiB perf map of a
    million ranges (a busy Node service's map is tens of MB). Memory stays within the allowance,
    reports on time (lines read on the report thread are bounded for all maps together, a report),
    what the maps hold within their budget; the maps are read (their first line names the
    attacker's code). Read to their budget, at a test's pace, in test_perfmap."""
    perf_maps = arena.receiver.jit.perf_maps
    lines = perf_maps.stats["lines"]
    source = Path(tempfile.mkdtemp(prefix="perfmaps-", dir="/tmp"))
    os.chown(source, NOBODY, NOBODY)
    shared = source / "map"
    # (Written by a process of its own: this one's memory is the agent's, which is measured.)
    subprocess.run([sys.executable, "-c", "import sys\nwith open(sys.argv[1], 'w') as f:\n    f.write('401000 100000 perfmap_named_spin\\n')\n"
                    "    f.writelines(f'{0x7F0000000000 + i * 0x100:x} 80 LazyCompile:*handler /srv/app/routes.js:{i}\\n' for i in range(1_050_000))",
                    str(shared)], check=True)
    shared.chmod(0o644)
    os.chown(shared, NOBODY, NOBODY)
    program = arena.root / "spin-stripped"
    script = f"for i in 1 2 3 4 5 6; do sh -c 'ln {shared} /tmp/perf-$$.map && touch /tmp/perf-$$.map && exec {program} {ATTACK_S + 2}' & done; wait"
    try:
        exported, _attacker = arena.attack(lambda: arena.as_nobody(["sh", "-c", script]))
    finally:
        time.sleep(2)  # (the six exit on their own)
        for link in Path("/tmp").glob("perf-*.map"):
            if link.stat().st_ino == shared.stat().st_ino:
                link.unlink()
        shutil.rmtree(source, ignore_errors=True)
    named = {view.resource.get("process.pid") for message in exported for view in iter_samples(message)
             if view.frames and view.frames[0].function == "perfmap_named_spin"}
    assert named, "no map was read"  # (a report reads max_read_lines_per_report of them all: a few maps a report)
    assert perf_maps.stats["lines"] - lines >= perf_maps.max_read_lines_per_report
    assert perf_maps.held_bytes() <= perf_maps.max_total_bytes


# Maps each file it is given (argv[3:]) whole, readable and executable, as a library would be; or,
# with argv[2] > 1, the first page of each that many times, alternately r-x and --x so that no
# two merge (a maps line each). After a second it grows the file GROW names to a terabyte
# (sparse), then spins for argv[1] seconds.
MAPPER_C = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
__attribute__((noinline)) void mapper_spin(void) { for (int i = 0; i < 100000; i++) sink += i * 7; }
int main(int argc, char **argv) {
    double seconds = atof(argv[1]);
    long count = atol(argv[2]);
    for (int f = 3; f < argc; f++) {
        int fd = open(argv[f], O_RDONLY);
        if (fd < 0) return 1;
        off_t size = lseek(fd, 0, SEEK_END);
        for (long i = 0; i < count; i++) {
            int protection = i % 2 ? PROT_EXEC : PROT_READ | PROT_EXEC;
            if (mmap(NULL, count > 1 ? 4096 : size, protection, MAP_PRIVATE, fd, 0) == MAP_FAILED) return 2;
        }
        close(fd);
    }
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int grown = getenv("GROW") == NULL;
    do {
        mapper_spin();
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (!grown && now.tv_sec - start.tv_sec >= 1) {
            truncate(getenv("GROW"), 1L << 40);
            grown = 1;
        }
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
"""


def _mapper(arena: Arena, work: Path) -> Path:
    return compile_c(MAPPER_C, work / "mapper", "-fno-omit-frame-pointer")


def test_elf_bombs_mapped_by_a_process_cost_bounded_work_off_the_report(arena):
    """Issue 42, finding 2, end to end: the attacker maps files crafted to make parsers walk
    forever, under the names that send them to each reader: a CPython's libpython with 50
    aliased note sections of 4,000 notes (build ids, detection), a 4 MB `node` and a `libjvm.so`
    of 65,533 section headers (V8 and HotSpot detection, symbols, rows), a library whose
    relocations of the thread context are aliased 100 times (span links), and a file it grows to
    a terabyte after mapping it. Reports stay on time, memory within its allowance, and its own
    program is named."""
    from tests.elf_writer import SHT_NOTE, Section, body_offset, elf_file, note
    from tests.test_elf_bounds import note_bomb, relocation_bomb

    work = arena.attacker_dir / "bombs"
    work.mkdir()
    blob = b"".join(note(b"XYZ", 1, b"") for _ in range(8))
    headers_bomb = elf_file([Section(".note", SHT_NOTE, body_offset(0), len(blob), align=4)] * 65533, [], blob)
    files = [_file(work / "libpython3.12.so.1.0", note_bomb()), _file(work / "node", headers_bomb),
             _file(work / "libjvm.so", headers_bomb), _file(work / "libotel.so", relocation_bomb(aliases=100, relocations=2000)),
             _file(work / "libgrown.so", (arena.root / "spin-stripped").read_bytes())]
    mapper = _mapper(arena, work)
    for path in (work, mapper, *files):
        os.chown(path, NOBODY, NOBODY)
    receiver = arena.receiver
    runtimes = {"python": receiver.python.files, "v8": receiver.v8.files, "hotspot": receiver.hotspot.files}
    detections = {name: files.stats["detections"] for name, files in runtimes.items()}
    exported, attacker = arena.attack(lambda: arena.as_nobody([str(mapper), "60", "1", *map(str, files)],
                                                              env={**os.environ, "GROW": str(files[-1])}))
    assert attacker.returncode in (None, -9), attacker.stderr.read()
    assert "mapper_spin" in names_of(exported, attacker.pid)
    assert os.stat(files[-1]).st_size == 1 << 40  # (grown while mapped)
    # Each runtime parsed the file named for it (in the detection helper, killed past its deadline).
    assert all(files.stats["detections"] > detections[name] for name, files in runtimes.items()), \
        {name: files.stats for name, files in runtimes.items()}


def jvms_with_libjvm() -> list[int]:
    """nobody's PauseAtStartup JVMs that have libjvm.so mapped."""
    pids = [int(pid) for pid in subprocess.run(["pgrep", "-u", str(NOBODY), "-f", "PauseAtStartup"], capture_output=True, text=True).stdout.split()]
    return [pid for pid in pids if "libjvm.so" in _maps(pid)]


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def test_six_jvms_paused_while_starting_keep_reports_on_time(arena):
    """Issue 42: JVMs that stay "starting" (their tables not filled yet) are looked at again,
    a few a report, not all of them each report (six forged ones cost 0.3 s each, every report).
    Six real JVMs paused at start-up by their user (-XX:+PauseAtStartup waits for a file to go)."""
    if not shutil.which("java"):
        pytest.skip("no java here")
    hotspot = arena.receiver.hotspot
    before, detections_before = dict(hotspot.stats), dict(hotspot.files.stats)
    paused = "java -XX:+UnlockDiagnosticVMOptions -XX:+PauseAtStartup -version"
    jvms: list[int] = []

    def paused_jvms() -> subprocess.Popen:
        """The six JVMs, once each has libjvm mapped (paused: it runs no further), announced to the
        agent as a sample of theirs would: paused that early a JVM has used a CPU for a sample or
        two at the arena's rate, and whether the agent ever heard of it was a coin toss (here 4 of
        6 in one run; in ci4 of session 28, none)."""
        launcher = arena.as_nobody(["sh", "-c", f"for i in 1 2 3 4 5 6; do {paused} & done; wait"])
        assert wait_for(lambda: len(jvms_with_libjvm()) == 6, timeout=30), jvms_with_libjvm()
        jvms.extend(jvms_with_libjvm())
        for pid in jvms:
            arena.receiver.processes.on_new_process(pid, pid, "java")
        return launcher

    try:
        exported, attacker = arena.attack(paused_jvms)
    finally:
        subprocess.run(["pkill", "-9", "-u", str(NOBODY), "-f", "PauseAtStartup"], check=False)
    looked_at = {key: hotspot.stats[key] - before[key] for key in ("starting", "starting_deferred", "unknown_layout", "processes")}
    print("the JVMs:", jvms, "known to the process table:", [pid in arena.receiver.processes for pid in jvms])
    print("libjvm's detection:", {key: value - detections_before.get(key, 0) for key, value in hotspot.files.stats.items()})
    print("samples of the JVMs by report:", [sum(sum(view.values) for view in iter_samples(message) if view.resource.get("process.pid") in jvms)
                                             for message in exported])
    assert looked_at["starting"] >= 6, looked_at  # (each found starting, and kept for another look)


# Every round, 64 fresh copies of Deep (each defined by a class loader of its own: new Methods,
# each with its own 8 KiB line table, at new addresses), chained and called 64 deep; then dropped.
CHURN_JAVA = r"""
import java.nio.file.Files;
import java.nio.file.Path;

public class Churn {
    public interface Step { long f(int depth, long x); }

    static final class Loader extends ClassLoader {
        Loader(ClassLoader parent) { super(parent); }
        Class<?> define(byte[] bytes) { return defineClass("Deep", bytes, 0, bytes.length); }
    }

    public static void main(String[] args) throws Exception {
        byte[] deep = Files.readAllBytes(Path.of(args[0]));
        long sink = 0;
        while (true) {
            Step next = null;
            for (int i = 0; i < 64; i++) {
                Class<?> copy = new Loader(Churn.class.getClassLoader()).define(deep);
                next = (Step) copy.getConstructor(Step.class).newInstance(next);
            }
            sink += next.f(63, sink);
        }
    }
}
"""


def test_a_jvm_whose_interpreted_methods_change_all_the_time_costs_bounded_memory(arena):
    """Issue 42, finding 6 (a forged JVM's Methods changing every millisecond, each Method's line
    table 8 KiB: +2.5 GB in 40 s when line tables were cached by count), with a real JVM: -Xint,
    64 frames of 64 copies of one method of 2,000 lines, each copy its own class loader's, all
    new every ~60 ms (a thousand new Methods a second). The attacker's Java frames are named
    within the report's budget; memory within the allowance, reports on time."""
    if not shutil.which("javac"):
        pytest.skip("no javac here")
    work = arena.attacker_dir / "churn"
    work.mkdir()
    (work / "Churn.java").write_text(CHURN_JAVA)
    body = "\n".join("        x = x * 31 + depth;" for _ in range(2000))
    (work / "Deep.java").write_text("public class Deep implements Churn.Step {\n    private final Churn.Step next;\n"
                                    "    public Deep(Churn.Step next) { this.next = next; }\n    public long f(int depth, long x) {\n"
                                    f"{body}\n        return next == null ? x : next.f(depth - 1, x);\n    }}\n}}\n")
    subprocess.run(["javac", "-d", str(work), str(work / "Churn.java"), str(work / "Deep.java")], check=True, capture_output=True)
    for path in (work, *work.iterdir()):
        os.chown(path, NOBODY, NOBODY)
    hotspot = arena.receiver.hotspot
    before = dict(hotspot.stats)
    exported, attacker = arena.attack(lambda: arena.as_nobody(["java", "-Xint", "-cp", str(work), "Churn", str(work / "Deep.class")]))
    named = names_of(exported, attacker.pid)
    moved = {key: value - before.get(key, 0) for key, value in hotspot.stats.items() if value != before.get(key, 0)}
    assert any("Deep.f" in name for name in named), (sorted(named)[:20], moved)
    assert hotspot.stats["names_bytes"] <= 64 << 20, moved


def test_a_process_with_64_mib_of_maps_is_read_to_a_bound(arena):
    """Issue 42: 60,000 executable mappings of one file whose path is a kilobyte long make
    /proc/PID/maps 64 MiB. The agent reads it to its cap (counted), on time and within memory,
    and still names the attacker's own code."""
    work = arena.attacker_dir / "maps"
    levels = [work.joinpath(*["d" * 240] * depth) for depth in range(5)]
    levels[-1].mkdir(parents=True)
    target = _file(levels[-1] / "page", b"\0" * 8192)
    mapper = _mapper(arena, work)
    for path in (mapper, target, *levels):
        os.chown(path, NOBODY, NOBODY)
    table = arena.receiver.processes
    cut = table.stats["maps_cut"]
    exported, attacker = arena.attack(lambda: arena.as_nobody([str(mapper), "60", "60000", str(target)]))
    assert attacker.returncode in (None, -9), attacker.stderr.read()
    assert "mapper_spin" in names_of(exported, attacker.pid)
    assert table.stats["maps_cut"] > cut, table.stats
