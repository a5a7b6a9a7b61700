"""ProcessTable: container ids, /proc parsing, snapshots of real processes and their expiry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from receivers.profiling.processes.proc import container_id_from_cgroup, parse_maps, parse_stat
from receivers.profiling.processes.table import ProcessTable

ID = "3c4f9c8a1b2d4e6f8a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f"
ID2 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
UID = "7c1d3f8e-2a4b-4c6d-8e0f-1a2b3c4d5e6f"
UID_ = UID.replace("-", "_")


@pytest.mark.parametrize(
    "cgroup, expected",
    [
        # docker, cgroup v1 (one line per hierarchy) and v2
        (f"12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n0::/", ID),
        (f"0::/docker/{ID}", ID),
        (f"0::/system.slice/docker-{ID}.scope", ID),
        (f"1:name=systemd:/system.slice/docker-{ID}.scope\n0::/", ID),
        # systemd running inside the container
        (f"0::/system.slice/docker-{ID}.scope/init.scope", ID),
        # kubernetes, cgroup v1 (cgroupfs driver): besteffort/burstable/guaranteed
        (f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{ID}", ID),
        (f"4:memory:/kubepods/besteffort/pod{UID}/{ID}", ID),
        (f"4:memory:/kubepods/pod{UID}/{ID}", ID),
        # kubernetes, systemd driver: containerd, cri-o, docker
        ("0::/kubepods.slice/kubepods-burstable.slice/"
         f"kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope", ID),
        ("0::/kubepods.slice/kubepods-besteffort.slice/"
         f"kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope", ID),
        (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{ID}.scope", ID),
        (f"5:devices:/kubepods.slice/kubepods-pod{UID_}.slice/crio-{ID}.scope", ID),
        # podman
        (f"0::/machine.slice/libpod-{ID}.scope/container", ID),
        # nested: docker in docker -> the innermost container
        (f"0::/docker/{ID2}/docker/{ID}", ID),
        # not containers
        ("0::/", None),
        ("0::/user.slice/user-1000.slice/session-2.scope", None),
        ("0::/system.slice/containerd.service", None),
        # CRI-O's monitor process is not the container
        (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope", None),
        ("0::/docker/" + "g" * 64, None),  # not hex
        ("0::/docker/" + "a" * 63, None),  # too short
        (f"4:memory:/process_api/{ID[:32]}", None),
        ("", None),
    ],
)
def test_container_id_from_cgroup(cgroup, expected):
    assert container_id_from_cgroup(cgroup) == expected


def test_parse_maps_keeps_executable_mappings_and_deleted_marker():
    text = textwrap.dedent("""\
        55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 131 /usr/bin/app
        55d0c0a01000-55d0c0a05000 r-xp 00001000 fd:01 131 /usr/bin/app
        7f0000000000-7f0000010000 r-xp 00002000 fd:01 99 /opt/my lib/libx.so (deleted)
        7f0000020000-7f0000021000 rwxp 00000000 00:00 0
        7ffd5e1f0000-7ffd5e1f2000 r-xp 00000000 00:00 0                          [vdso]
    """)
    maps = parse_maps(text)
    assert [m.path for m in maps] == ["/usr/bin/app", "/opt/my lib/libx.so", "", "[vdso]"]
    app, lib, anon, vdso = maps
    assert (app.start, app.end, app.offset, app.dev, app.inode) == (
        0x55D0C0A01000, 0x55D0C0A05000, 0x1000, "fd:01", 131)
    assert lib.deleted and not app.deleted and lib.identity == ("fd:01", 99)
    assert app.file_backed and not anon.file_backed and not vdso.file_backed


def test_parse_stat_survives_hostile_comm():
    line = "1234 (a) (b c) S 1 1234 1234 0 -1 4194560 1 0 0 0 5 6 0 0 20 0 1 0 98765 1 2 3"
    st = parse_stat(line)
    assert st["comm"] == "a) (b c" and st["ppid"] == 1 and st["starttime"] == 98765


CHILD = r"""
import ctypes, os, sys, threading
def worker():
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write("worker-one")
    ready.set()
    threading.Event().wait()
ready = threading.Event()
threading.Thread(target=worker, daemon=True).start()
ready.wait()
print("ready", flush=True)
line = sys.stdin.readline()
if line.startswith("dlopen"):
    lib = ctypes.CDLL(line.split()[1])
    print(hex(ctypes.cast(lib.marker_function, ctypes.c_void_p).value), flush=True)
    sys.stdin.readline()
"""


def start_child(**env):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, **env},
    )
    assert child.stdout.readline() == "ready\n"
    return child


def test_snapshot_of_a_live_process():
    child = start_child(PYCOLLECTOR_WANTED="yes", PYCOLLECTOR_UNWANTED="no")
    try:
        table = ProcessTable(include_env_vars=["PYCOLLECTOR_WANTED", "NOT_SET"])
        seen = []
        table.watch(changed=seen.append)
        info = table.on_new_process(child.pid, child.pid, "python3")
        assert seen == [info] and table.lookup(child.pid) is info
        assert info.errors == [] and not info.exited and not info.kernel_thread
        assert info.exe_path == os.path.realpath(sys.executable)
        assert info.executable_name == os.path.basename(info.exe_path)
        assert info.cmdline[:2] == [sys.executable, "-c"]
        assert info.env == {"PYCOLLECTOR_WANTED": "yes"}
        assert "worker-one" in info.threads.values()
        assert info.threads[child.pid] == "python3"  # the name the sample carried wins
        with open("/proc/self/cgroup") as f:
            assert info.container_id == container_id_from_cgroup(f.read())
        libc = [m for m in info.mappings if "libc.so" in m.path]
        assert libc and all("x" in m.perms for m in info.mappings)
        assert info.find_mapping(libc[0].start + 1) == libc[0]
        assert info.find_mapping(0x10) is None
        # the start time is the process's, in wall-clock ns
        assert abs(info.start_time_ns - time.time_ns()) < 60e9
        table.observe_thread(child.pid, 4242, "renamed")
        assert table.thread_name(child.pid, 4242) == "renamed"
    finally:
        child.kill()
        child.wait()


def test_maps_refresh_after_dlopen_is_rate_limited(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    src = tmp_path / "marker.c"
    src.write_text("int marker_function(int x) { return x + 1; }\n")
    lib = tmp_path / "libmarker.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, src], check=True)
    child = start_child()
    try:
        now = [100.0]
        table = ProcessTable(maps_refresh_interval_s=5.0, clock=lambda: now[0])
        table.on_new_process(child.pid, child.pid, "python3")
        child.stdin.write(f"dlopen {lib}\n")
        child.stdin.flush()
        addr = int(child.stdout.readline(), 16)
        assert table.find_mapping(child.pid, addr) is None  # snapshot predates the dlopen
        now[0] += 1.0
        assert table.find_mapping(child.pid, addr) is None  # too soon to re-read maps
        assert table.stats["maps_refreshes"] == 0
        now[0] += 5.0
        m = table.find_mapping(child.pid, addr)
        assert m is not None and m.path == str(lib) and table.stats["maps_refreshes"] == 1
        # After a refresh too: a miss (an address in no mapping) waits its interval again.
        assert table.find_mapping(child.pid, 0x10) is None
        now[0] += 1.0
        assert table.find_mapping(child.pid, 0x10) is None and table.stats["maps_refreshes"] == 1
    finally:
        child.kill()
        child.wait()


def test_an_exiting_process_keeps_its_mappings():
    """A process that has exited but is not reaped yet (as one is while it exits) reads empty
    maps: a refresh on a miss then must not empty what the snapshot had, which its last samples
    need. CI runs lost a whole report's frames of a process that way."""
    child = start_child()
    table = ProcessTable()
    info = table.on_new_process(child.pid, child.pid, "python3")
    known = info.mappings[0].start
    child.stdin.close()  # start_child's loop ends; nobody reaps it yet
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/maps").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert Path(f"/proc/{child.pid}/maps").read_text() == "", "a zombie has no maps"
        assert table.find_mapping(child.pid, 0x10, rate_limited=False) is None  # a miss: maps read again
        assert table.find_mapping(child.pid, known) is not None and info.mappings, "the snapshot's mappings stay"
    finally:
        child.kill()
        child.wait()


def test_deleted_executable_is_marked(tmp_path):
    exe = tmp_path / "sleeper"
    shutil.copy("/bin/sleep", exe)
    child = subprocess.Popen([str(exe), "30"])
    try:
        deadline = time.monotonic() + 10  # Popen returns once exec began, maybe before the kernel mapped the file
        while str(exe) not in Path(f"/proc/{child.pid}/maps").read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        exe.unlink()
        info = ProcessTable().on_new_process(child.pid, child.pid, "sleeper")
        assert info.exe_path == str(exe) and info.exe_deleted, (info, os.readlink(f"/proc/{child.pid}/exe"))
        main = [m for m in info.mappings if m.path == str(exe)]
        assert main and all(m.deleted for m in main), (info.mappings, Path(f"/proc/{child.pid}/maps").read_text())
    finally:
        child.kill()
        child.wait()


def test_vanished_process_keeps_what_we_got_and_expires_after_a_report():
    child = start_child()
    table = ProcessTable()
    table.on_new_process(child.pid, child.pid, "python3")
    other = subprocess.Popen([sys.executable, "-c", "pass"])
    other.wait()
    # announced after it was gone (a lost race): an entry with errors, marked exited
    gone = table.on_new_process(other.pid, other.pid, "python3")
    assert gone.exited and gone.errors and gone.threads == {other.pid: "python3"}
    assert table.lookup(999_999_999) is None  # never seen, not alive: nothing invented

    child.kill()
    child.wait()
    # First report after the exit: the process is marked, still there for late samples.
    assert table.forget_exited() == [other.pid]
    info = table.lookup(child.pid)
    assert info is not None and info.exited and info.exe_path
    # Next report: gone.
    assert table.forget_exited() == [child.pid]
    assert child.pid not in table and len(table) == 0


def test_lookup_snapshots_a_process_whose_announcement_was_lost():
    child = start_child()
    try:
        table = ProcessTable()
        info = table.lookup(child.pid)
        assert info is not None and info.exe_path == os.path.realpath(sys.executable)
        assert table.lookup(child.pid) is info
        assert table.forget_exited() == []
    finally:
        child.kill()
        child.wait()


def test_a_snapshot_keeps_a_bounded_command_line():
    """A command line is its process's to choose: 300 children of one of 4.5 MB cost 234 MB when
    snapshots kept it whole. A snapshot keeps the first MAX_CMDLINE_BYTES."""
    from receivers.profiling.processes.proc import MAX_CMDLINE_BYTES

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", *["x" * (100 << 10)] * 15])  # 1.5 MB
    try:
        time.sleep(0.2)
        info = ProcessTable().on_new_process(child.pid, child.pid, "python3")
        assert info.cmdline[:2] == [sys.executable, "-c"]
        assert len("\0".join(info.cmdline)) <= MAX_CMDLINE_BYTES
    finally:
        child.kill()
        child.wait()


# Maps the first page of a file argv[2] times, alternately r-x and --x so that no two mappings
# merge (a line of /proc/PID/maps each), says so, and waits.
MANY_MAPPINGS = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
for i in range(int(sys.argv[2])):  # (PROT_EXEC 4, PROT_READ 1, MAP_PRIVATE 2)
    assert libc.mmap(None, 4096, 4 | (0 if i % 2 else 1), 2, fd, 0) != ctypes.c_void_p(-1).value
print("mapped", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("mappings, max_bytes", [(20_000, None), (2_000, 64 << 10)])
def test_a_snapshot_keeps_a_bounded_part_of_a_long_maps_file(tmp_path, monkeypatch, mappings, max_bytes):
    """Issue 42: /proc/PID/maps is as long as its process makes it (65,530 mappings of a
    kilobyte path: 64 MiB, read whole on the events thread with every snapshot). A snapshot reads
    MAX_MAPS_BYTES of it and keeps MAX_EXECUTABLE_MAPPINGS executable mappings, and counts the cut."""
    from receivers.profiling.processes import proc, table as table_module

    if max_bytes is not None:
        monkeypatch.setattr(table_module, "MAX_MAPS_BYTES", max_bytes)
    page = tmp_path / "page"
    page.write_bytes(bytes(8192))
    child = subprocess.Popen([sys.executable, "-c", MANY_MAPPINGS, str(page), str(mappings)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"mapped\n"
        table = ProcessTable()
        info = table.on_new_process(child.pid, child.pid, "python3")
        of_page = [mapping for mapping in info.mappings if mapping.path == str(page)]
        assert table.stats["maps_cut"] == 1 and any("maps:" in error for error in info.errors), (table.stats, info.errors)
        if max_bytes is None:
            assert len(info.mappings) == proc.MAX_EXECUTABLE_MAPPINGS
        else:
            assert 0 < len(of_page) < max_bytes // 60
        assert {mapping.perms[:3] for mapping in of_page} == {"r-x", "--x"}  # (the lines it kept are whole)
    finally:
        child.kill()
        child.wait()


def test_long_maps_are_read_within_one_rate_for_all_processes(tmp_path, monkeypatch):
    """Issue 42: reads of long maps (past MAX_PROMPT_REFRESH_BYTES) share MAPS_BYTES_PER_SECOND,
    however many processes have them (a forker's children inherit its 60,000 mappings, each
    child a snapshot): past it a snapshot reads MAX_PROMPT_REFRESH_BYTES; a long one is not read
    again at once on the unwinder's miss but waits the refresh interval; short maps are read
    whole and at once as before."""
    from receivers.profiling.processes import table as table_module

    page = tmp_path / "page"
    page.write_bytes(bytes(8192))
    children = [subprocess.Popen([sys.executable, "-c", MANY_MAPPINGS, str(page), "12000"], stdout=subprocess.PIPE) for _ in range(2)]
    now = [100.0]
    try:
        for child in children:
            assert child.stdout.readline() == b"mapped\n"
        length = len(Path(f"/proc/{children[0].pid}/maps").read_bytes())  # (its path's length decides: 1-2.5 MB)
        assert (1 << 20) < length < 2.5 * (1 << 20)
        monkeypatch.setattr(table_module, "MAPS_BYTES_PER_SECOND", int(1.2 * length))  # (one whole a second, and a fifth)
        table = ProcessTable(clock=lambda: now[0])
        first = table.on_new_process(children[0].pid, children[0].pid, "python3")
        assert first.maps_bytes == length and not first.errors
        second = table.on_new_process(children[1].pid, children[1].pid, "python3")
        assert second.maps_bytes <= 1 << 20 and table.stats["maps_cut"] == 1  # (the second's rest waits)
        # On the unwinder's miss: not at once (long), but after the interval when the rate has
        # room for all of it (a part would replace the whole).
        assert table.refresh_maps(children[0].pid, rate_limited=False) is None
        now[0] += 1.0
        assert table.refresh_maps(children[0].pid, rate_limited=False) is None and table.stats["maps_refreshes_deferred"] == 1
        now[0] += 1.0
        assert table.refresh_maps(children[0].pid, rate_limited=False) is first
        assert table.stats["maps_unchanged"] == 1 and len(first.mappings) > 12_000  # (the watchers not told of the same mappings again)
        # Unchanged again and again: each time the next read waits twice as long (a hostile
        # process's misses do not have its megabytes parsed every second on the events thread).
        now[0] += 1.0
        assert table.refresh_maps(children[0].pid, rate_limited=False) is None  # (2 s now)
        now[0] += 1.0
        assert table.refresh_maps(children[0].pid, rate_limited=False) is first and table.stats["maps_unchanged"] == 2
        now[0] += 3.0
        assert table.refresh_maps(children[0].pid, rate_limited=False) is None  # (4 s now)
        now[0] += 1.0
        assert table.refresh_maps(children[0].pid, rate_limited=False) is first and table.stats["maps_unchanged"] == 3
        short = table.on_new_process(os.getpid(), os.getpid(), "python")
        assert short.maps_bytes < 1 << 20 and not any("maps" in error for error in short.errors)
    finally:
        for child in children:
            child.kill()
            child.wait()
