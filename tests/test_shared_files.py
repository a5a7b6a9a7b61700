"""What one process could not open costs no other process (issue 42: nothing per file decided by
one process).

A file is opened for a process as that process (processes/files.py), so a failed open says what
one process may: its credentials, its mount namespace, whether it is still alive. The rooms that
read a file once for every process that maps it (unwind rows, CPython detection, symbols) must
not remember such a failure for the others. Here a process of root's maps two root-only files
(a C program without frame pointers and a CPython interpreter), then drops to user nobody, who
may not read them: every open for it is refused. Root then runs both files: its C program must
reach main (unwind rows) and its Python program must have Python frames.
"""

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

from receivers.profiling.processes import files as process_files

from tests.conftest import WORKLOADS, bpf_unavailable_reason, capturing_service

pytestmark = pytest.mark.bpf

NOBODY = 65534
ENTRY = {"main", "__libc_start_call_main", "__libc_start_main", "_start"}

# Maps each file named on its command line executable, as root, then becomes nobody and spins
# (so it is sampled, and its mappings registered) until killed.
DROPPER_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
volatile unsigned long sink;
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) || mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) { perror(argv[i]); return 1; }
        close(fd);
    }
    if (setgroups(0, NULL) || setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534)) { perror("drop"); return 1; }
    printf("dropped\n");
    fflush(stdout);
    for (;;) sink++;
}
"""


def test_a_file_one_process_may_not_open_is_still_read_for_another_that_maps_it(tmp_path):
    if reason := bpf_unavailable_reason():
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.skip("needs root to drop a process to nobody")
    place = Path(tempfile.mkdtemp(prefix="pycollector-shared-", dir="/var/tmp"))
    place.chmod(0o755)
    c_program, python = place / "known_split", place / "python3"
    (place / "dropper.c").write_text(DROPPER_C)
    subprocess.run(["gcc", "-O2", "-o", str(place / "dropper"), str(place / "dropper.c")], check=True)
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(c_program), str(WORKLOADS / "known_split.c")], check=True)
    shutil.copy(os.path.realpath("/usr/bin/python3"), python)
    for path in (c_program, python):
        path.chmod(0o700)  # root's alone: nobody may not open them
    service, capture = capturing_service(tmp_path, hz=99)
    service.start()
    receiver = receiver_of(service)
    runs: list[subprocess.Popen] = []
    try:
        refused = process_files.stats["unreadable_by_process"]
        dropper = subprocess.Popen([str(place / "dropper"), str(c_program), str(python)], stdout=subprocess.PIPE, text=True)
        runs.append(dropper)
        assert dropper.stdout.readline() == "dropped\n"
        c_file = (process_files.device_name(c_program.stat().st_dev), c_program.stat().st_ino)
        deadline = time.monotonic() + 30  # its mappings registered, their opens tried and refused
        while process_files.stats["unreadable_by_process"] < refused + 2 or receiver.unwind.file_state(c_file) in (None, "queued"):
            assert time.monotonic() < deadline, (process_files.stats, receiver.unwind.stats, receiver.unwind.file_state(c_file))
            time.sleep(0.1)
        c_run = subprocess.Popen([str(c_program), "6"], stdout=subprocess.DEVNULL)
        python_run = subprocess.Popen([str(python), str(WORKLOADS / "known_split.py"), "6"], stdout=subprocess.DEVNULL)
        runs += [c_run, python_run]
        c_run.wait(timeout=60)
        python_run.wait(timeout=60)
        time.sleep(0.3)
    finally:
        for run in runs:
            run.kill()
            run.wait()
        service.shutdown()
        shutil.rmtree(place, ignore_errors=True)
    c_stacks, python_stacks = [], []
    for message in capture.consumer.messages:
        for view in iter_samples(message):
            functions = {frame.function for frame in view.frames}
            count = view.values[0] if view.values else 1
            if view.resource.get("process.pid") == c_run.pid:
                c_stacks.append((count, bool(ENTRY & functions)))
            elif view.resource.get("process.pid") == python_run.pid:
                python_stacks.append((count, "spin_heavy" in functions))
    c_samples, c_at_entry = sum(n for n, _ in c_stacks), sum(n for n, entry in c_stacks if entry)
    python_samples, in_python = sum(n for n, _ in python_stacks), sum(n for n, named in python_stacks if named)
    # (its first samples, before its rows are in the kernel, stop short of main)
    assert c_samples >= 100 and c_at_entry / c_samples >= 0.8, (c_samples, c_at_entry, receiver.unwind.stats)
    assert python_samples >= 100 and in_python / python_samples >= 0.5, (python_samples, in_python)
