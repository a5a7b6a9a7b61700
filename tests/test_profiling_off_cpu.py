"""Off-CPU profiling (issue 16) with real BPF.

Workloads that compute 25% of the time and block in read() on a pipe 75% of the time (answered
by a writer thread 75 ms after each request) each measure the time they spend in read(). One
receiver run with off_cpu_threshold 1.0 profiles them: the CPU profile must put the compute
function on top, and the off-CPU profile must hold the blocking call path, from the scheduler
down through read() to the program's entry, with the time each measured within 10%. The C
workload is built without frame pointers, so its off-CPU stacks are walked with unwind tables,
as CPU samples are; the Python one must show its Python function. With a process filter, only the
matching process has off-CPU time.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples, sample_type
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, receiver_of, registry_with

from tests.conftest import bpf_unavailable_reason, build_go_program

pytestmark = pytest.mark.bpf

HZ = 99
SECONDS = 5.0
WORKLOADS = Path(__file__).parent / "testdata" / "off_cpu"
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's CPython 3.11
ENTRY = {"_start", "__libc_start_main", "__libc_start_call_main"}


@pytest.fixture(scope="module")
def unwind_cache(tmp_path_factory) -> Path:
    """One row cache for the module's runs, as a restarted collector keeps it: the second run
    does not build libc's and the workload's rows again while the workload waits."""
    return tmp_path_factory.mktemp("unwind-cache")


@pytest.fixture(scope="module")
def blocking_read(tmp_path_factory) -> Path:
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    built = tmp_path_factory.mktemp("off_cpu") / "blocking_read"
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-pthread", "-o", str(built), str(WORKLOADS / "blocking_read.c")], check=True)
    return built


@pytest.fixture(scope="module")
def go_sleeping(tmp_path_factory) -> Path:
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    if not shutil.which("go"):
        pytest.skip("no Go toolchain (Debian's golang-go)")
    return build_go_program(WORKLOADS / "sleeping.go", tmp_path_factory.mktemp("off_cpu_go") / "sleeping")


def receiver_config(unwind_cache: Path) -> dict:
    return {
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "1s", "off_cpu_threshold": 1.0,
                                    "unwind_cache_dir": str(unwind_cache)}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }


class Profiled:
    """One process's samples, CPU and off-CPU: (thread id, frame names leaf first, value)."""

    def __init__(self) -> None:
        self.cpu: list[tuple[int, list[str], int]] = []
        self.off_cpu: list[tuple[int, list[str], int]] = []

    def blocked_in(self, *functions: str) -> int:
        """Nanoseconds off the CPU with all of ``functions`` on the stack."""
        return sum(value for _, names, value in self.off_cpu if all(function in names for function in functions))


def profiles_by_pid(messages) -> dict[int, Profiled]:
    by_pid: dict[int, Profiled] = collections.defaultdict(Profiled)
    for message in messages:
        for view in iter_samples(message):
            kind = sample_type(message, view.profile)
            assert kind in (("samples", "count"), ("off_cpu", "nanoseconds")), kind
            entry = (view.attributes.get("thread.id"), [frame.function for frame in view.frames], sum(view.values))
            profiled = by_pid[view.resource.get("process.pid")]
            (profiled.off_cpu if kind[0] == "off_cpu" else profiled.cpu).append(entry)
    return by_pid


def test_off_cpu_profile_holds_the_blocking_path_and_the_time_blocked(blocking_read, unwind_cache):
    capture = CapturingExporterFactory()
    service = Service(build_plan(receiver_config(unwind_cache), registry_with(exporters={"capture": capture})))
    service.start()
    try:
        native = subprocess.Popen([str(blocking_read), str(SECONDS)], stdout=subprocess.PIPE, text=True)
        python = subprocess.Popen([SYSTEM_PYTHON, str(WORKLOADS / "blocking_read.py"), str(SECONDS)], stdout=subprocess.PIPE, text=True)
        measured = {name: int(process.communicate(timeout=60)[0]) for name, process in (("native", native), ("python", python))}
        time.sleep(0.2)
    finally:
        service.shutdown()  # reports the last partial interval
    profiles = profiles_by_pid(capture.consumer.messages)

    # The C workload: compute on CPU, the read path off it.
    c = profiles[native.pid]
    cpu_samples = sum(value for _, _, value in c.cpu)
    in_compute = sum(value for _, names, value in c.cpu if "compute" in names)
    # Its main thread's time in read(), from the kernel frames; and with the user frames, which
    # the process's unwind tables give (they load while it first sleeps).
    in_read = sum(value for tid, names, value in c.off_cpu if tid == native.pid and "vfs_read" in names)
    blocked = c.blocked_in("wait_for_data", "vfs_read")
    print(f"C: {in_compute} of {cpu_samples} CPU samples in compute; off-CPU {in_read / 1e9:.3f} s in read(), "
          f"{blocked / 1e9:.3f} s of it in wait_for_data; the workload measured {measured['native'] / 1e9:.3f} s")
    assert cpu_samples >= SECONDS * HZ * 0.15, "about a quarter of the run was on the CPU"
    assert in_compute >= 0.8 * cpu_samples, "the CPU profile shows the compute function"
    assert abs(in_read - measured["native"]) <= 0.1 * measured["native"], "blocked time within 10% of what the workload measured"
    assert abs(blocked - measured["native"]) <= 0.1 * measured["native"], "the blocked time's user stacks are unwound"
    path = max((entry for entry in c.off_cpu if "wait_for_data" in entry[1]), key=lambda entry: entry[2])[1]
    print("C off-CPU path, leaf first:", " <- ".join(path))
    assert path[0] == "__schedule", "the stack starts where the thread left the CPU"
    assert "vfs_read" in path and path.index("vfs_read") < path.index("wait_for_data") < path.index("main"), "kernel read path, then the caller"
    assert ENTRY & set(path), "the unwinder walked to the program's entry"
    assert not any("wait_for_data" in names and "compute" in names for _, names, _ in c.off_cpu)
    # The writer thread sleeps in usleep(): its own path, on its own thread.
    reader_threads = {tid for tid, names, _ in c.off_cpu if "wait_for_data" in names}
    assert any("usleep" in names or "clock_nanosleep" in names for tid, names, _ in c.off_cpu if tid not in reader_threads)

    # The Python workload: its Python function on the blocking path (in read(): a preemption in
    # the os.write() before it is off-CPU time in wait_for_data that the workload does not time).
    p = profiles[python.pid]
    blocked = p.blocked_in("wait_for_data", "vfs_read")
    print(f"Python: {blocked / 1e9:.3f} s off-CPU in wait_for_data, the workload measured {measured['python'] / 1e9:.3f} s")
    assert abs(blocked - measured["python"]) <= 0.1 * measured["python"]
    path = max((entry for entry in p.off_cpu if "wait_for_data" in entry[1]), key=lambda entry: entry[2])[1]
    print("Python off-CPU path, leaf first:", " <- ".join(path))
    assert path.index("wait_for_data") < path.index("main") < path.index("<module>")
    assert sum(value for _, names, value in p.cpu if "compute" in names) >= 0.6 * sum(value for _, _, value in p.cpu)


def test_targeting_leaves_other_processes_out_of_the_off_cpu_profile(blocking_read, unwind_cache):
    """With a process filter, only the matching process's switches are recorded: the kernel looks
    the leaving thread's process up in its target set before anything else."""
    config = receiver_config(unwind_cache)
    config["receivers"]["profiling"]["process_filter"] = {"command_line": "^" + str(blocking_read)}
    capture = CapturingExporterFactory()
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    try:
        target = subprocess.Popen([str(blocking_read), "2"], stdout=subprocess.PIPE, text=True)
        other = subprocess.Popen([SYSTEM_PYTHON, str(WORKLOADS / "blocking_read.py"), "2"], stdout=subprocess.PIPE, text=True)
        measured = int(target.communicate(timeout=60)[0])
        other.communicate(timeout=60)
        time.sleep(0.2)
    finally:
        service.shutdown()
    profiles = profiles_by_pid(capture.consumer.messages)
    blocked = profiles[target.pid].blocked_in("wait_for_data", "vfs_read")
    in_read = sum(value for tid, names, value in profiles[target.pid].off_cpu if tid == target.pid and "vfs_read" in names)
    print(f"target: {blocked / 1e9:.3f} s blocked of {measured / 1e9:.3f} s measured ({in_read / 1e9:.3f} s in read()); processes with off-CPU time: "
          f"{sorted(pid for pid, p in profiles.items() if p.off_cpu)}")
    assert abs(blocked - measured) <= 0.1 * measured
    assert {pid for pid, p in profiles.items() if p.off_cpu or p.cpu} == {target.pid}, "only the target is profiled"


# Where a Go thread's stack starts: a goroutine's (runtime.goexit), a thread's (runtime.mstart,
# runtime.rt0_go), or the scheduler's on the thread's own stack (runtime.mcall).
GO_ROOTS = {"runtime.goexit", "runtime.mstart", "runtime.rt0_go", "runtime.mcall"}


def test_go_threads_park_in_the_scheduler_and_their_stacks_end_where_go_says(go_sleeping, unwind_cache):
    """A Go program's goroutine sleeps while its threads park: their stacks go from the futex
    wait up through the scheduler to runtime.mcall, and stop there, as Go's own traceback does.
    Go before 1.21 (Debian's is 1.19) leaves the goroutine's frame pointer in place across mcall,
    and frame pointers beyond it lead into a goroutine stack that has moved on."""
    capture = CapturingExporterFactory()
    service = Service(build_plan(receiver_config(unwind_cache), registry_with(exporters={"capture": capture})))
    service.start()
    try:
        go = subprocess.Popen([str(go_sleeping), "3"], stdout=subprocess.PIPE, text=True)
        slept = int(go.communicate(timeout=60)[0])
        time.sleep(0.2)
    finally:
        service.shutdown()
    profile = profiles_by_pid(capture.consumer.messages)[go.pid]
    off_cpu = sum(value for _, _, value in profile.off_cpu)
    by_root: collections.Counter = collections.Counter()
    for _, names, value in profile.off_cpu:
        by_root[names[-1] if names[-1] in GO_ROOTS else f"other: {names[-1]}"] += value
    in_scheduler = sum(value for _, names, value in profile.off_cpu if "runtime.schedule" in names)
    cpu = sum(value for _, _, value in profile.cpu)
    in_compute = sum(value for _, names, value in profile.cpu if "main.compute" in names)
    print(f"Go: slept {slept / 1e9:.3f} s; its threads {off_cpu / 1e9:.3f} s off-CPU, {in_scheduler / 1e9:.3f} s of it in "
          f"runtime.schedule; by outermost frame {[(name, round(value / 1e9, 3)) for name, value in by_root.most_common()]}; "
          f"{in_compute} of {cpu} CPU samples in main.compute")
    assert in_compute >= 0.8 * cpu
    assert in_scheduler >= 0.9 * slept, "a thread parks in the scheduler while the goroutine sleeps"
    beyond = [(names, value) for _, names, value in profile.off_cpu if GO_ROOTS & set(names[:-1])]
    assert not beyond, f"nothing beyond where Go's stacks start: {beyond[:3]}"
    assert sum(value for name, value in by_root.items() if name in GO_ROOTS) >= 0.99 * off_cpu, by_root.most_common(6)


# Sleeps a second as soon as it starts, with a frame pointer that leads to a "return address" no
# user address can be: bit 63 set, the mark of a runtime's frame among a stack's frames. The frame
# is on its stack, above the stack pointer, where the kernel's walk looks (one outside the stack it
# does not follow). No libc, no loader: it sleeps microseconds after its exec, before the agent
# has heard of it, so its wait's user stack is the kernel's frame-pointer walk. (A Go thread's
# stack beyond runtime.mstart held such a value, which came out as a nameless frame beyond Go's root.)
FORGED_SLEEPER_C = r"""
static const long one_second[2] = {1, 0};
void _start(void) {
    __asm__ volatile("sub $64, %%rsp\n lea 32(%%rsp), %%rbp\n movq $0, (%%rbp)\n"
                     "movabs $0x8000000000001230, %%rax\n mov %%rax, 8(%%rbp)\n"
                     "mov $35, %%eax\n mov %0, %%rdi\n xor %%esi, %%esi\n syscall\n"  /* nanosleep */
                     "mov $60, %%eax\n xor %%edi, %%edi\n syscall\n"  /* exit */
                     : : "r"(one_second) : "memory", "rax", "rdi", "rsi", "rcx", "r11");
}
"""


def test_a_wait_the_kernel_walked_ends_before_a_return_address_beyond_user_space(tmp_path, unwind_cache):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    source = tmp_path / "forged_sleeper.c"
    source.write_text(FORGED_SLEEPER_C)
    program = tmp_path / "forged_sleeper"
    subprocess.run(["gcc", "-O1", "-static", "-nostdlib", "-no-pie", "-o", str(program), str(source)], check=True)
    capture = CapturingExporterFactory()
    service = Service(build_plan(receiver_config(unwind_cache), registry_with(exporters={"capture": capture})))
    service.start()
    try:
        sleeper = subprocess.Popen([str(program)])
        sleeper.wait(timeout=30)
        time.sleep(0.2)
    finally:
        service.shutdown()
    off_cpu = profiles_by_pid(capture.consumer.messages)[sleeper.pid].off_cpu
    slept = [(names, value) for _, names, value in off_cpu if "hrtimer_nanosleep" in names]
    assert sum(value for _, value in slept) >= 0.9e9, off_cpu
    assert {tuple(names[names.index("entry_SYSCALL_64_after_hwframe") + 1:]) for names, _ in slept} == {("_start",)}, slept


def test_waits_of_threads_that_no_longer_exist_are_pruned(unwind_cache):
    """A wait is dropped when its thread comes back to a CPU; one whose thread never does would
    hold its entry in off_cpu_waits for good. The prune drops those, and only those."""
    service = Service(build_plan(receiver_config(unwind_cache), registry_with(exporters={"capture": CapturingExporterFactory()})))
    service.start()
    try:
        sampler = receiver_of(service)._sampler
        waits = sampler._off_cpu_waits
        sleeper = subprocess.Popen(["sleep", "30"])
        time.sleep(0.3)  # it left the CPU: its wait is recorded
        gone = subprocess.Popen(["true"])
        gone.wait()
        waits[waits.Key(gone.pid)] = waits.Leaf()  # as if its last switch had been recorded
        pruned = sampler.prune_off_cpu_waits()
        tids = {key.value for key in waits.keys()}
        assert gone.pid not in tids and pruned >= 1
        assert sleeper.pid in tids, "a live thread's wait must stay"
        assert sampler.counters()["off_cpu_waits_pruned"] == pruned
        sleeper.kill()
        sleeper.wait()
    finally:
        service.shutdown()
