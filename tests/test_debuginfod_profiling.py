"""The profiling receiver names a stripped program from the debug file a debuginfod server has
(elfutils' debuginfod on loopback, over a directory holding only that file, its answer 3 s late):
the program runs as user nobody beside the same build unstripped; the reports before the file
arrives leave its functions unnamed, and those from the second after it name the stripped one as
the symbol table names the other. A server that never answers makes no report late."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from pycollector.pdata import iter_samples
from pycollector.testing import receiver_of
from tests.conftest import WORKLOADS, bpf_unavailable_reason, capturing_service, share_tolerance
from tests.debuginfod_servers import Debuginfod, Misbehaving, relayed_after, silent
from tests.test_profiling_unwind import share_of

HZ = 499
SECONDS = 14
FETCH_S = 3.0
SILENT_SECONDS = 8
NOBODY = 65534


def frames_by_report(messages, pid: int, program: str) -> list[tuple[int, int, list[tuple[list[str], int]]]]:
    """Per report: (the samples' frames in ``program``'s own file, those named, the stacks as
    function names leaf first with their counts) of process ``pid``."""
    out = []
    for message in messages:
        own = named = 0
        stacks = []
        for view in iter_samples(message):
            if view.resource.get("process.pid") != pid:
                continue
            count = sum(view.values)
            frames = [frame for frame in view.frames if frame.frame_type != "kernel"]
            stacks.append(([frame.function or "" for frame in frames], count))
            for frame in frames:
                if frame.mapping_filename == program:
                    own += count
                    named += count if frame.function else 0
        out.append((own, named, stacks))
    return out


def build(directory: Path, served: Path) -> tuple[Path, Path, str]:
    """known_split built with symbols, and stripped (its debug file in ``served``): (the one, the
    other, their build id)."""
    unstripped, program = directory / "known_split", directory / "known_split_stripped"
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-g", "-o", unstripped, WORKLOADS / "known_split.c"], check=True)
    subprocess.run(["objcopy", "--only-keep-debug", unstripped, served / "known_split.debug"], check=True)
    subprocess.run(["strip", "--strip-all", "-o", program, unstripped], check=True)
    build_id = subprocess.run(["readelf", "-n", program], capture_output=True, text=True, check=True).stdout.split("Build ID: ")[1].split()[0]
    return unstripped, program, build_id


def profiled_as_nobody(tmp_path: Path, programs: list[Path], seconds: float, **debuginfod):
    """``programs`` run as user nobody for ``seconds`` under the profiling receiver whose
    ``debuginfod`` keys are these: (the reports, the debuginfod client's counts, how many reports
    had been exported when the first fetch ended (None: none did), when each report came)."""
    service, capture = capturing_service(tmp_path, HZ, debuginfod={"cache_dir": str(tmp_path / "debuginfod"), **debuginfod})
    service.start()
    fetched_at, arrivals = None, []
    try:
        workloads = [subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", str(path), str(seconds)],
                                      stdout=subprocess.DEVNULL) for path in programs]
        stats = receiver_of(service).symbolizer.debuginfod.stats
        messages = capture.consumer.messages
        while any(workload.poll() is None for workload in workloads):
            if fetched_at is None and stats["fetched"]:
                fetched_at = len(messages)  # (reports exported before the fetch ended)
            if len(messages) > len(arrivals):
                arrivals += [time.monotonic()] * (len(messages) - len(arrivals))
            time.sleep(0.05)
        assert [workload.returncode for workload in workloads] == [0] * len(programs)
        time.sleep(1.5)
    finally:
        service.shutdown()
    print("debuginfod:", stats)
    return messages, [workload.pid for workload in workloads], stats, fetched_at, arrivals


@pytest.fixture
def nobodys_directory():
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run the program as another user")
    directory = Path(tempfile.mkdtemp(prefix="pycollector-debuginfod-", dir="/var/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.bpf
def test_a_stripped_programs_frames_are_named_within_two_reports_of_its_debug_file_arriving(tmp_path, nobodys_directory):
    served = tmp_path / "served"
    served.mkdir()
    unstripped, program, build_id = build(nobodys_directory, served)
    server = Debuginfod(served, serving=[build_id])
    slow = Misbehaving(relayed_after(FETCH_S, server.url, build_id))
    try:
        messages, pids, stats, fetched_at, _ = profiled_as_nobody(tmp_path, [program, unstripped], SECONDS, urls=[slow.url])
    finally:
        slow.stop()
        server.stop()
    # (the host's other stripped files, libc's among them, are asked for too: the server has none of them)
    assert fetched_at is not None and stats["fetched"] == 1 and stats["requests"] == stats["not_found"] + 1, stats
    reports = frames_by_report(messages, pids[0], str(program))
    before = sum(named for _, named, _ in reports[:fetched_at]), sum(own for own, _, _ in reports[:fetched_at])
    after = reports[fetched_at + 2:]
    own, named = sum(own for own, _, _ in after), sum(named for _, named, _ in after)
    print(f"before the fetch ended: {before[0]}/{before[1]} named; from the second report after it: {named}/{own} "
          f"in {len(after)} reports (fetch ended by report {fetched_at} of {len(reports)})")
    assert own >= HZ and named / own >= 0.99, (named, own)
    assert fetched_at >= 2 and before[1] >= HZ and before[0] == 0, before  # (its functions are static: .dynsym names none)
    ours, samples = share_of([stack for _, _, stacks in after for stack in stacks], "spin_heavy", "spin_light")
    full, full_samples = share_of([stack for _, _, stacks in frames_by_report(messages[fetched_at + 2:], pids[1], str(unstripped))
                                   for stack in stacks], "spin_heavy", "spin_light")
    print(f"spin_heavy: {ours:.3f} of {samples} stripped, {full:.3f} of {full_samples} unstripped")
    both = 1 / (1 / max(samples, 1) + 1 / max(full_samples, 1))
    assert abs(ours - full) <= max(0.05, share_tolerance(both)), (ours, full, samples, full_samples)


@pytest.mark.bpf
def test_a_server_that_never_answers_makes_no_report_late_and_is_not_asked_again(tmp_path, nobodys_directory):
    """A socket that accepts and never answers, with a timeout of 3 s a read: the reports come
    each second all the same, the program's frames stay unnamed, the failed fetches (one per
    fetching thread at most) are counted and nothing more is asked of the server."""
    served = tmp_path / "served"
    served.mkdir()
    _, program, _ = build(nobodys_directory, served)
    server = Misbehaving(silent)
    try:
        messages, [pid], stats, _, arrivals = profiled_as_nobody(tmp_path, [program], SILENT_SECONDS, urls=[server.url], timeout="3s")
    finally:
        server.stop()
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:])]
    reports = frames_by_report(messages, pid, str(program))
    own, named = sum(own for own, _, _ in reports), sum(named for _, named, _ in reports)
    print(f"{len(arrivals)} reports, the longest gap {max(gaps):.2f} s; {named}/{own} of the program's frames named")
    assert len(arrivals) >= SILENT_SECONDS // 2 and max(gaps) <= 2.5, gaps  # (each second, not held up 3 s by a fetch)
    assert own >= HZ and named == 0, (own, named)
    assert 1 <= stats["failures"] == stats["requests"] <= 2 and stats["servers_down"] >= 1 and stats["fetched"] == 0, stats
