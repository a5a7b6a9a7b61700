"""What /proc says about the processes the bench measures: CPU time and memory of a process
tree, the host's load, and which perf events and BPF programs a process holds."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BPF_PROG_TYPE_KPROBE = 2
BPF_PROG_TYPE_PERF_EVENT = 7
BPF_PROG_TYPE_RAW_TRACEPOINT = 17
KIB_PER_MIB = 1024


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat from field 3 (state) on; comm may hold spaces and parentheses."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue  # the thread ended while we looked
    return found


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of pid, of its live descendants, and of the children it has reaped."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime are fields 14-17; fields[0] is field 3.
    ticks = sum(int(value) for value in fields[11:15])
    return ticks / CLOCK_TICKS + sum(tree_cpu_seconds(child) for child in _children(pid))


def tree_run_seconds(pid: int) -> float:
    """Time on CPU of every live thread of pid and of its live descendants, from schedstat (ns
    resolution, where /proc/PID/stat counts 10 ms ticks). A thread that exits takes its time
    with it, so use this over windows the threads outlive."""
    total_ns = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue
    return total_ns / 1e9 + sum(tree_run_seconds(child) for child in _children(pid))


def threads(pid: int) -> set[int]:
    try:
        return {int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()}
    except OSError:
        return set()


def memory_kib(pid: int, field: str) -> int:
    """A line of /proc/PID/status in KiB: VmHWM (peak RSS) or VmRSS (RSS now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(f"/proc/{pid}/status has no {field}")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg has them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def perf_event_mappings(pid: int) -> int:
    """Ring buffers of perf events that pid has mapped (perf maps them once they are open)."""
    try:
        return Path(f"/proc/{pid}/maps").read_text().count("anon_inode:[perf_event]")
    except OSError:
        return 0


def sampling_bpf_programs(pid: int, prog_types: tuple[int, ...] = (BPF_PROG_TYPE_PERF_EVENT,)) -> list[dict[str, int]]:
    """The BPF programs of those types pid holds (by default perf_event: the ones a sampling
    profiler attaches to the CPU clock), each as its fdinfo: prog_id, run_cnt, run_time_ns."""
    programs = []
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return programs
    for fd in fds:
        try:
            if os.readlink(fd) != "anon_inode:bpf-prog":
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in info.splitlines() if ":\t" in line)
        if int(fields.get("prog_type", -1)) in prog_types:
            programs.append({key: int(fields.get(key, 0)) for key in ("prog_id", "run_cnt", "run_time_ns")})
    return programs


def online_cpus() -> int:
    return len(os.sched_getaffinity(0))
