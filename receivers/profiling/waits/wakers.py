"""Who woke a lock waiter: the frames and attributes of a ``lock_wake`` sample (issue 44).

bpf/off_cpu.bpf.c records, for each recorded lock wait, the thread that woke the waiter as it woke
it (sched_waking: a futex_wake in pthread_mutex_unlock, a condition variable's signal), with its
kernel and user stacks. A lock_wake sample is that wait's time under one stack that joins the two,
as BCC's offwaketime folds them. Leaf first: the waker's frames from its outermost (the thread's
start) in to the wakeup (``try_to_wake_up``), a marker frame, then the waiter's frames from the
scheduler out. A flame graph, root at the bottom, shows the waiter's stack up to where it blocked,
the marker, and above it the waker's stack upside down: the wakeup, the code that released the
lock (futex_wake, pthread_mutex_unlock), then the code that held it. The waker's frames nearest
the wakeup are alike for every wait on one lock and merge; the holders split off where they
differ, so who held the lock is the first split above the marker (with the waker's stack the right
way up, the split would come at each thread's start, and the holders would be spread across the
top of the graph).

The marker says what the waker was:

- WOKEN_BY: a thread of the waiter's process, its user frames named as the waiter's are;
- WOKEN_BY_PROCESS: a thread of another process (a process-shared lock): its kernel frames only,
  as the kernel does not walk the user stack of a process the waiter's frames cannot name;
- WOKEN_BY_INTERRUPT: the wakeup ran in an interrupt (a timeout's timer, a device's completion)
  or on an idle CPU: the thread it interrupted woke no one, so its frames are left out and only
  the kernel's, from the interrupt's entry in, are kept;
- NOT_SEEN: no waker was recorded for the wait (it was woken before its switch off the CPU
  reached the profiler; bpf/off_cpu.bpf.c).

The waker's thread id and name are the sample's ``lock.waker.thread.id`` and
``lock.waker.thread.name`` (and ``lock.waker.process.pid`` for another process's), for the first
two kinds.
"""

from __future__ import annotations

import re

from pycollector.pdata import MARKER_FRAME_TYPE

from receivers.profiling.symbols.frame import Frame

WOKEN_BY = "[woken by]"
WOKEN_BY_PROCESS = "[woken by another process]"
WOKEN_BY_INTERRUPT = "[woken by an interrupt]"
NOT_SEEN = "[waker not seen]"
MARKERS = frozenset((WOKEN_BY, WOKEN_BY_PROCESS, WOKEN_BY_INTERRUPT, NOT_SEEN))

# Where every wakeup's kernel stack starts: the frames above it are the tracepoint's and the BPF
# program's own.
WAKEUP = "try_to_wake_up"
# The kernel's entries into an interrupt and into the softirq work that follows one (x86-64's names):
# a wakeup below one of these ran in an interrupt, not for the thread it interrupted.
_INTERRUPT_ENTRY = re.compile(r"^(?:asm_)?(?:__)?(?:sysvec_|common_interrupt|spurious_interrupt)|^(?:__)?irq_exit|"
                              r"^handle_softirqs$|^__do_softirq$|^do_softirq|^run_ksoftirqd$")


def marker(name: str) -> Frame:
    return Frame(0, MARKER_FRAME_TYPE, name)


def woken_by(waker, tgid: int, kernel: list[Frame], user: list[Frame]) -> list[Frame]:
    """The frames a lock_wake sample of process ``tgid`` puts before its waiter's (see the module):
    ``waker`` (kernel/samples.py's Waker) and its kernel and user frames, leaf first."""
    if not seen(waker):
        return [marker(NOT_SEEN)]
    kernel = _from_wakeup(kernel)
    entry = next((index for index, frame in enumerate(kernel) if frame.name and _INTERRUPT_ENTRY.search(frame.name)), None)
    if entry is not None or waker.tid == 0:
        return [*reversed(kernel[: entry + 1] if entry is not None else kernel), marker(WOKEN_BY_INTERRUPT)]
    if waker.tgid != tgid:
        return [*reversed(kernel), marker(WOKEN_BY_PROCESS)]
    return [*reversed(kernel + user), marker(WOKEN_BY)]


def seen(waker) -> bool:
    """Whether a waker was recorded (the kernel leaves the key empty when none was)."""
    return bool(waker.tid or waker.comm)


def waiter_frames(frames: list[Frame]) -> list[Frame]:
    """A lock_wake sample's waiter's frames: those after the marker (all of them without one)."""
    at = next((index for index, frame in enumerate(frames) if frame.kind == MARKER_FRAME_TYPE), None)
    return frames if at is None else frames[at + 1:]


def waker_attributes(waker, tgid: int, frames: list[Frame]) -> dict:
    """The sample attributes that name a lock_wake sample's waker, when it was a thread that woke
    the waiter (not an interrupt, nor unseen: the marker in ``frames`` says)."""
    found = next((frame.name for frame in frames if frame.kind == MARKER_FRAME_TYPE), None)
    if found not in (WOKEN_BY, WOKEN_BY_PROCESS):
        return {}
    attributes = {"lock.waker.thread.id": waker.tid, "lock.waker.thread.name": waker.comm}
    if waker.tgid != tgid:
        attributes["lock.waker.process.pid"] = waker.tgid
    return attributes


def _from_wakeup(frames: list[Frame]) -> list[Frame]:
    """A waker's kernel stack without the frames above the wakeup (the tracepoint's)."""
    for index, frame in enumerate(frames):
        if frame.name == WAKEUP:
            return frames[index:]
    return frames
