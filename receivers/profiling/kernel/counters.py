"""The profiler's counters: the BPF program's, named in bpf/profile.h, and the user side's."""

from __future__ import annotations

import re
from pathlib import Path

from receivers.profiling.kernel.program import SamplerError

BPF_HEADER = Path(__file__).resolve().parent.parent / "bpf" / "profile.h"  # bpf/ as package data (see sampler.BPF_DIR)

# Counters kept in user space, next to the ones read from the BPF per-CPU array.
USER_COUNTERS = ("lost_events", "late_announcements", "missing_stacks", "stacks_freed",
                 "intervals", "callback_errors", "stack_overflow_received", "stack_overflow_lost",
                 "off_cpu_waits_pruned", "stack_map_races")


# Fewer stack map collisions than this in an interval are not worth a warning, whatever their share.
MIN_COLLISIONS_WARNED = 10


def read_counter_names(header: Path = BPF_HEADER) -> list[str]:
    """Counter names in index order, read from `enum profile_counter` in profile.h."""
    text = header.read_text()
    found = {int(v): n.lower() for n, v in re.findall(r"^\s*COUNTER_(\w+)\s*=\s*(\d+)\s*,", text, re.M)}
    total = int(re.search(r"^\s*PROFILE_NR_COUNTERS\s*=\s*(\d+)", text, re.M).group(1))
    if sorted(found) != list(range(total)):
        raise SamplerError(f"{header}: enum profile_counter is not 0..{total - 1} in order")
    return [found[i] for i in range(total)]


def counter_warnings(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """Human warnings for what went wrong between two counters() snapshots (log once each)."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    out = []
    if d.get("map_full"):
        out.append(f"{d['map_full']} samples dropped because the count map was full; "
                   "consider raising map_scale_factor or shortening reporter_interval")
    coll = d.get("kernel_stack_collision", 0) + d.get("user_stack_collision", 0)
    # A stack id is a hash bucket, so a few collisions happen at any size; warn past 1%, and not
    # for the handful an interval of few samples can have (1 of a first interval's 60 warned).
    if coll >= MIN_COLLISIONS_WARNED and coll > 0.01 * d.get("samples", 0):
        out.append(f"{coll} of {d.get('samples', 0)} samples hit a stack map hash collision; "
                   "they were sent to user space with their stacks through the perf buffer "
                   "(about 2 KiB each) rather than lost; consider raising map_scale_factor to "
                   "cut that cost")
    if d.get("stack_overflow_errors"):
        out.append(f"{d['stack_overflow_errors']} samples lost a stack to a stack map hash "
                   "collision: the perf buffer was full, so they were counted without it; "
                   "consider raising map_scale_factor")
    lost = d.get("lost_events", 0) + d.get("perf_output_errors", 0)
    if lost:
        out.append(f"{lost} new-process events lost (perf buffer full); those processes are "
                   "read from /proc later, when they may already have exited")
    if d.get("unwind_truncated"):
        out.append(f"{d['unwind_truncated']} user stacks were longer than unwind_max_frames and lost "
                   "their outermost frames; raise receivers::profiling::unwind_max_frames (up to 480)")
    if d.get("unwind_stack_map_full"):
        out.append(f"{d['unwind_stack_map_full']} unwound stacks found their stack map full and went "
                   "through the perf buffer; consider raising map_scale_factor")
    if d.get("off_cpu_waits_full"):
        out.append(f"{d['off_cpu_waits_full']} switches off a CPU were not recorded: more threads were away "
                   "at once than the off-CPU table holds; consider raising map_scale_factor or lowering off_cpu_threshold")
    if d.get("off_cpu_lost"):
        out.append(f"{d['off_cpu_lost']} off-CPU waits were lost: their stacks fit neither the stack map nor "
                   "the perf buffer; consider raising map_scale_factor")
    if d.get("stack_map_races"):
        out.append(f"{d['stack_map_races']} counts (a stack's samples in an interval) lost a stack to the kernel's stack map race (two CPUs "
                   "storing different stacks in one empty bucket at once); they are counted without it; "
                   "a larger map_scale_factor makes it rarer")
    if d.get("memory_lost") or d.get("memory_walks_full"):
        out.append(f"{d.get('memory_lost', 0) + d.get('memory_walks_full', 0)} sampled allocations were lost: their stacks did not fit "
                   "the stack map, or more threads were walking one at once than the walk table holds; consider raising map_scale_factor")
    if d.get("waits_throttled"):
        out.append(f"{d['waits_throttled']} lock or I/O waits were not walked: past their process's wait_events_per_second (their time "
                   "is in lock_wait and io_wait all the same, spread over the process's walked waits of the interval, or under a "
                   "[waits past wait_events_per_second] frame); raise receivers::profiling::wait_events_per_second for their own stacks")
    if d.get("throttled_time_lost"):
        out.append(f"{d['throttled_time_lost']} throttled waits' time was lost: more threads were away in them at once than the "
                   "off-CPU table holds, or more processes throttled in one interval than its table holds; consider raising map_scale_factor")
    if d.get("lock_wakes_lost"):
        out.append(f"{d['lock_wakes_lost']} lock waits are missing from the lock_wake profile (they are in lock_wait): its table was full, "
                   "or their stacks could not be stored; consider raising map_scale_factor")
    # (A few waits are woken before their thread's switch reached the profiler: 0% to 4% of a busy
    # host's here. Past 10%, say so.)
    if d.get("lock_wakers_unseen", 0) > 0.1 * max(1, d.get("lock_wakers", 0) + d.get("lock_wakers_unseen", 0)):
        out.append(f"{d['lock_wakers_unseen']} of the lock waits' wakers were not seen (lock_wake's [waker not seen]): woken before "
                   "their switch off the CPU reached the profiler, or across a report")
    if d.get("thread_stacks_throttled"):
        out.append(f"{d['thread_stacks_throttled']} threads left a CPU at a new place past their process's wait_events_per_second: not "
                   "walked there (the threads profile counts each such thread, until its next walk, under a frame saying its stack is out "
                   "of date); raise receivers::profiling::wait_events_per_second")
    if d.get("thread_stacks_full"):
        out.append(f"{d['thread_stacks_full']} thread stacks were not kept: more threads than thread_stacks holds (the threads profile "
                   "counts those threads under a frame saying their stack is not known); consider raising map_scale_factor")
    if d.get("memory_throttled"):
        out.append(f"{d['memory_throttled']} sampled allocations came past their process's allocation_events_per_second: not walked, "
                   "their bytes and number added to the process's next walked allocation (totals kept, the stacks of those are not); "
                   "raise receivers::profiling::allocation_events_per_second, or the process's sampling interval")
    if d.get("memory_budgets_full"):
        out.append(f"{d['memory_budgets_full']} sampled allocations were lost: more processes were allocating than the memory "
                   "budget table holds (4,096)")
    if d.get("memory_arg_errors"):
        out.append(f"{d['memory_arg_errors']} allocation probe events could not be read where their SDT notes said (the process's "
                   "own probes: its allocations are left out)")
    if d.get("live_heap_full") or d.get("live_stacks_full") or d.get("live_process_full"):
        out.append(f"the live heap was full: {d.get('live_heap_full', 0)} sampled allocations left out of the in-use profiles, "
                   f"{d.get('live_process_full', 0)} more because their process held its share (an eighth), "
                   f"{d.get('live_stacks_full', 0)} kept without their stack; consider raising map_scale_factor")
    if d.get("missing_stacks"):
        out.append(f"{d['missing_stacks']} stack ids could not be read back from the stack map")
    return out


def unwind_warnings(before: dict[str, int], after: dict[str, int]) -> list[tuple[str, str]]:
    """(key, warning) for what the unwind registry could not do between two stats snapshots;
    each key is meant to be logged once."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    out = []
    if d.get("row_budget_exhausted"):
        out.append(("row_budget", "the unwind row budget is full: rows of idle files, then of processes over their "
                    "share, are given back to make room; a file that still finds none is walked by frame pointer until "
                    "there is; raise receivers::profiling::unwind_row_budget (12 bytes of kernel memory a row)"))
    if d.get("file_ids_exhausted"):
        out.append(("file_ids", "the unwinder's file table (4096 files mapped at once) is full: further "
                    "files are walked by frame pointer"))
    if d.get("mappings_dropped"):
        out.append(("mappings", "a process has more than 256 executable mappings; the unwinder knows the "
                    "first 256 and walks the rest by frame pointer"))
    return out
