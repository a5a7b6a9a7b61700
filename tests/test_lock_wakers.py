"""Who woke a lock waiter (issue 44): the lock_wake profile, each lock wait's time under its
waiter's stack joined by a marker frame to its waker's (receivers/profiling/waits/wakers.py,
bpf/off_cpu.bpf.c's off_cpu_waking). The real-BPF test runs tests/testdata/waits/lock_contention.c
as an ordinary user (nobody), with BCC's offwaketime on the same run printed beside ours."""

from __future__ import annotations

import collections
import gzip
import io
import json
import os
import shutil
import subprocess
import time
from types import SimpleNamespace

import pytest

from pycollector.pdata import MARKER_FRAME_TYPE, ProfilesBuilder, iter_samples, sample_type
from pycollector.testing import receiver_of

from exporters.pprof.profile_proto import Profile

from receivers.profiling.kernel.count_maps import STACK_HASHED, SlotReader
from receivers.profiling.kernel.samples import ORIGIN_LOCK_WAKE, Waker
from receivers.profiling.symbols.frame import Frame
from receivers.profiling.waits import wakers
from tests.conftest import capturing_service
from tests.test_lock_io_waits import NOBODY, WAITS, build, rows_loaded

KERNEL = "[kernel.kallsyms]"


def kernel(*names: str) -> list[Frame]:
    return [Frame(0xFFFFFFFF81000000 + i, "kernel", name, file=KERNEL) for i, name in enumerate(names)]


def native(*names: str, file: str = "/usr/lib/libc.so.6") -> list[Frame]:
    return [Frame(0x7F0000000000 + i, "native", name, file=file) for i, name in enumerate(names)]


TRACEPOINT = ("bpf_trace_run1", "__traceiter_sched_waking")
FUTEX_WAKE = ("try_to_wake_up", "wake_up_q", "futex_wake", "do_futex", "__x64_sys_futex", "do_syscall_64", "entry_SYSCALL_64_after_hwframe")


def test_a_waker_of_the_same_process_is_its_stack_upside_down_above_the_marker():
    """Leaf first: the waker's frames root first (so that, root at the bottom, the wakeup sits on
    the marker and the holder's function above the unlock), then the marker; the tracepoint's
    frames above try_to_wake_up left out; the waker named in the attributes."""
    waker = Waker(100, 102, "worker", [1], [2])
    user = native("__lll_unlock_wake", "pthread_mutex_unlock") + native("hold_the_lock", "contend", file="/app") + native("start_thread")
    frames = wakers.woken_by(waker, 100, kernel(*TRACEPOINT, *FUTEX_WAKE), user)
    names = [frame.name for frame in frames]
    assert names == ["start_thread", "contend", "hold_the_lock", "pthread_mutex_unlock", "__lll_unlock_wake", *reversed(FUTEX_WAKE), wakers.WOKEN_BY]
    assert frames[-1].kind == MARKER_FRAME_TYPE
    waiter = kernel("__schedule", "schedule", "futex_wait") + native("__lll_lock_wait", "pthread_mutex_lock")
    assert wakers.waiter_frames(frames + waiter) == waiter
    assert wakers.waker_attributes(waker, 100, frames) == {"lock.waker.thread.id": 102, "lock.waker.thread.name": "worker"}


def test_an_interrupt_is_no_thread_and_an_unseen_waker_is_said():
    """A wakeup below an interrupt's entry (a timeout's timer) keeps the kernel's frames from the
    entry in, not those of the thread it interrupted, and names no thread; the idle task likewise;
    a waker of another process keeps its kernel frames and says whose; none seen is a marker alone."""
    timer = kernel("try_to_wake_up", "hrtimer_wakeup", "__hrtimer_run_queues", "hrtimer_interrupt", "__sysvec_apic_timer_interrupt",
                   "sysvec_apic_timer_interrupt", "asm_sysvec_apic_timer_interrupt", "do_syscall_64")
    interrupted = Waker(100, 103, "busy", [1], [2])
    frames = wakers.woken_by(interrupted, 100, timer, native("spin", file="/app"))
    assert [frame.name for frame in frames] == ["__sysvec_apic_timer_interrupt", "hrtimer_interrupt", "__hrtimer_run_queues", "hrtimer_wakeup",
                                                "try_to_wake_up", wakers.WOKEN_BY_INTERRUPT]
    assert wakers.waker_attributes(interrupted, 100, frames) == {}
    idle = wakers.woken_by(Waker(0, 0, "swapper/1", [1], []), 100, kernel("try_to_wake_up", "hrtimer_wakeup"), [])
    assert idle[-1].name == wakers.WOKEN_BY_INTERRUPT
    other = Waker(200, 201, "peer", [1], [])
    frames = wakers.woken_by(other, 100, kernel(*FUTEX_WAKE), [])
    assert frames[-1].name == wakers.WOKEN_BY_PROCESS and frames[0].name == FUTEX_WAKE[-1]
    assert wakers.waker_attributes(other, 100, frames) == {"lock.waker.thread.id": 201, "lock.waker.thread.name": "peer", "lock.waker.process.pid": 200}
    unseen = Waker(0, 0, "", [], [], -2, -2)
    assert [frame.name for frame in wakers.woken_by(unseen, 100, [], [])] == [wakers.NOT_SEEN]


class _Table:
    """A retired map as SlotReader drains it: its entries once, then nothing."""

    def __init__(self, entries):
        self.entries = list(entries)

    def items_lookup_and_delete_batch(self):
        entries, self.entries = self.entries, []
        return entries

    def keys(self):
        return []


def _key(tid: int, origin: int, user_hash: int, kernel_hash: int):
    return SimpleNamespace(tgid=100, pid=tid, comm=b"waiter", kernel_stack_id=STACK_HASHED, user_stack_id=STACK_HASHED, user_leaf_return=0,
                           user_stack_hash=user_hash, origin=origin, kernel_stack_hash=kernel_hash, trace_id=bytes(16), span_id=bytes(8),
                           process_start=0, device=0)


def test_a_retired_slot_gives_lock_wakes_with_their_wakers_stacks():
    """wake_counts_N's rows come out as the waiter's StackCount (origin lock_wake) with its waker,
    whose stacks are read from the same slot's stored stacks; a missing one is counted."""
    stacks = {1: [0x401000, 0x401100], 2: [0xFFFFFFFF81000010], 3: [0x402000], 4: [0xFFFFFFFF81000020]}
    stored = _Table((key, SimpleNamespace(ips=ips, len=len(ips))) for key, ips in stacks.items())
    waker = SimpleNamespace(tgid=100, pid=102, comm=b"holder", kernel_stack_id=STACK_HASHED, user_stack_id=STACK_HASHED,
                            kernel_stack_hash=4, user_stack_hash=3)
    lost = SimpleNamespace(tgid=100, pid=103, comm=b"holder", kernel_stack_id=STACK_HASHED, user_stack_id=STACK_HASHED,
                           kernel_stack_hash=4, user_stack_hash=99)
    wakes = _Table([(SimpleNamespace(waiter=_key(101, ORIGIN_LOCK_WAKE, 1, 2), waker=waker), 5_000_000),
                    (SimpleNamespace(waiter=_key(101, ORIGIN_LOCK_WAKE, 1, 2), waker=lost), 1_000)])
    slot = SlotReader(None).read(_Table([]), _Table([]), stored, wakes)
    first, second = slot.stacks
    assert (first.origin, first.count, first.user_addrs, first.kernel_addrs) == (ORIGIN_LOCK_WAKE, 5_000_000, stacks[1], stacks[2])
    assert first.waker == Waker(100, 102, "holder", stacks[4], stacks[3])
    assert second.waker.user_addrs == [] and second.waker.user_stack_error == -2 and slot.missing == 1


def lock_wake_profiles():
    """A process's lock_wait and lock_wake profiles, as the receiver makes them: three waits in
    pthread_mutex_lock, two woken by the thread that unlocked in hold_the_lock (whose stack, root
    first, stands before the marker), one by a timeout's interrupt."""
    builder = ProfilesBuilder()
    app = builder.mapping(0x1000, 0x9000, 0, "/app")
    libc = builder.mapping(0x7F0000000000, 0x7F0000100000, 0, "/usr/lib/libc.so.6")

    def kernel_frame(name):
        return builder.location(lines=[(builder.function(name), 0, 0)], attributes={"profile.frame.type": "kernel"})

    def frame(mapping, address, name):
        return builder.location(mapping, address, [(builder.function(name), 0, 0)], {"profile.frame.type": "native"})

    def marker(name):
        return builder.location(lines=[(builder.function(name), 0, 0)], attributes={"profile.frame.type": MARKER_FRAME_TYPE})

    waiter = [kernel_frame("__schedule"), kernel_frame("futex_wait"), frame(libc, 0x7F0000000100, "pthread_mutex_lock"),
              frame(app, 0x1100, "wait_for_the_lock"), frame(app, 0x1200, "contend")]
    holder = [frame(app, 0x1200, "contend"), frame(app, 0x1300, "hold_the_lock"), frame(libc, 0x7F0000000200, "pthread_mutex_unlock"),
              kernel_frame("futex_wake"), kernel_frame("try_to_wake_up")]
    timer = [kernel_frame("__sysvec_apic_timer_interrupt"), kernel_frame("hrtimer_wakeup"), kernel_frame("try_to_wake_up")]
    scope = builder.scope_profiles(builder.resource_profiles({"process.pid": 100, "process.executable.name": "app"}))
    waits = builder.profile(scope, sample_type=("lock_wait", "nanoseconds"), period_type=("", ""), time_unix_nano=1_700_000_000_123_000_000)
    builder.sample(waits, builder.stack(waiter), [30_000_000], attributes={"thread.id": 101, "lock.kind": "mutex"})
    wakes = builder.profile(scope, sample_type=("lock_wake", "nanoseconds"), period_type=("", ""), time_unix_nano=1_700_000_000_123_000_000)
    builder.sample(wakes, builder.stack(holder + [marker(wakers.WOKEN_BY)] + waiter), [20_000_000],
                   attributes={"thread.id": 101, "lock.kind": "mutex", "lock.waker.thread.id": 102})
    builder.sample(wakes, builder.stack(timer + [marker(wakers.WOKEN_BY_INTERRUPT)] + waiter), [10_000_000], attributes={"thread.id": 101, "lock.kind": "mutex"})
    return builder.data


def test_every_output_shows_lock_wake(tmp_path):
    """The debug exporter lists the wakers (the code outside the library that woke: hold_the_lock,
    not pthread_mutex_unlock; an interrupt by its marker); pprof writes lock_wake to its own file,
    the marker a function there; diff reads it by its type; the flame graph page names the types."""
    from exporters.debug.config import DebugConfig
    from exporters.debug.exporter import DebugExporter
    from exporters.flamegraph import page
    from exporters.flamegraph.compare import read_stacks
    from exporters.pprof.factory import factory as pprof
    from pycollector.testing import TestHost, make_settings

    output = io.StringIO()
    debug = DebugExporter(make_settings("exporters", "debug"), DebugConfig(verbosity="normal", sampling_initial=100), output=output)
    debug.start(TestHost())
    debug.consume(lock_wake_profiles())
    debug.shutdown()
    lines = output.getvalue().splitlines()
    at = next(index for index, line in enumerate(lines) if "lock_wake/nanoseconds" in line)
    assert lines[at] == "  Profile #1  lock_wake/nanoseconds  samples=2  total=30.0ms"
    assert lines[at + 1].strip().startswith("Top wakers")
    assert lines[at + 2].split() == ["20.0ms", "66.7%", "hold_the_lock", "[app]"]
    assert lines[at + 3].split()[:2] == ["10.0ms", "33.3%"] and lines[at + 3].endswith(wakers.WOKEN_BY_INTERRUPT)
    assert "marker functions" not in output.getvalue()

    exporter = pprof.create(make_settings("exporters", "pprof"), pprof.config_model(directory=str(tmp_path)), None)
    exporter.start(TestHost())
    exporter.consume(lock_wake_profiles())
    exporter.shutdown()
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == ["20231114T221320.123Z-app-100-lock_wait.pb.gz", "20231114T221320.123Z-app-100-lock_wake.pb.gz"]
    profile = Profile.FromString(gzip.decompress((tmp_path / written[1]).read_bytes()))
    assert [(profile.string_table[t.type], profile.string_table[t.unit]) for t in profile.sample_type] == [("lock_wake", "nanoseconds")]
    assert wakers.WOKEN_BY in {profile.string_table[function.name] for function in profile.function}

    stacks, value_type, _ = read_stacks(tmp_path / written[1], "lock_wake")
    assert value_type == ("lock_wake", "nanoseconds") and sum(value for _, value in stacks) == 30_000_000
    heaviest = max(stacks, key=lambda entry: entry[1])[0]  # (root first: the waiter, the marker, the waker upside down)
    names = [name for name, _ in heaviest]
    assert names.index("wait_for_the_lock") < names.index(wakers.WOKEN_BY) < names.index("hold_the_lock")

    if shutil.which("node"):
        script = """const units = require(process.argv[1]);
            console.log(JSON.stringify(["lock_wait", "lock_wake", "io_wait"].map((type) => units.describe({type: type, unit: "nanoseconds"}).label)));"""
        result = subprocess.run(["node", "-e", script, str(page.ASSETS / "units.js")], capture_output=True, text=True, timeout=30)
        assert json.loads(result.stdout) == ["Lock waits", "Lock waits by waker", "I/O waits"], result.stderr


# ---- real BPF -------------------------------------------------------------------------------


def _attached(process: subprocess.Popen, timeout: float = 90) -> bool:
    """Whether BCC's tool in ``process`` attached its programs (it holds perf events, one a probe)
    before ``timeout``; False when it ended first (it could not)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            links = [os.readlink(f"/proc/{process.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{process.pid}/fd")]
        except OSError:
            links = []
        if sum(link == "anon_inode:[perf_event]" for link in links) >= 2:
            return True
        time.sleep(0.2)
    return False


def _split(frames) -> tuple[list, list]:
    """(waker's frames, leaf first; waiter's) of a lock_wake sample."""
    at = next(index for index, frame in enumerate(frames) if frame.frame_type == MARKER_FRAME_TYPE)
    return list(reversed(frames[:at])), frames[at + 1:]


@pytest.mark.bpf
def test_the_waker_is_the_holder_of_the_mutex_and_the_signaller_of_the_condvar(workdir):
    """Four threads take one mutex in turn, each holding it 5 ms asleep in hold_the_lock: of the
    lock_wake time under wait_for_the_lock, 90% or more has hold_the_lock in its waker's stack (the
    thread that unlocked it), and lock_wake's total is lock_wait's; the 400 ms condition-variable
    wait's waker is signal_later, the thread that signalled it. BCC's offwaketime, run on the same
    process, is printed beside (not compared: it needs kprobes, which not every kernel has)."""
    program = build(WAITS / "lock_contention.c", workdir / "lock_contention", "-pthread")
    service, capture = capturing_service(workdir, 49, lock_profiling=True)
    service.start()
    offwaketime = None
    try:
        workload = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", str(program), "3", "wait"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=workdir)
        # (its waits' stacks go through libc to the workload's functions: their rows first)
        print("unwind rows still loading:", rows_loaded(service, workload.pid, ("libc.so.6", "lock_contention")))
        tool = shutil.which("offwaketime-bpfcc")
        if tool:
            offwaketime = subprocess.Popen([tool, "-f", "-p", str(workload.pid), "10"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            attached = _attached(offwaketime)
            print(f"offwaketime-bpfcc {'attached' if attached else 'did not attach'}")
        printed = workload.communicate("go\n", timeout=120)[0]
        assert workload.returncode == 0, printed
        time.sleep(1.5)  # (its last waits' report)
        counters = receiver_of(service)._sampler.counters()
    finally:
        service.shutdown()
        if offwaketime is not None and offwaketime.poll() is None:
            offwaketime.send_signal(2)  # (SIGINT: it prints what it has)
        tool_output = offwaketime.communicate(timeout=60) if offwaketime is not None else ("", "offwaketime-bpfcc is not installed")
    figures = {name: int(value) for name, value in (line.split() for line in printed.splitlines())}

    waits: collections.Counter = collections.Counter()  # lock_wait by site
    wakes: collections.Counter = collections.Counter()  # lock_wake by (site, lock.kind, the waker's function of the workload)
    folded: collections.Counter = collections.Counter()
    sites = ("wait_for_the_lock", "wait_for_the_signal")
    wakers_of = ("hold_the_lock", "signal_later", "wait_for_the_lock")
    for message in capture.consumer.messages:
        for view in iter_samples(message):
            if view.resource.get("process.pid") != workload.pid:
                continue
            kind = sample_type(message, view.profile)[0]
            if kind == "lock_wait":
                waits[next((frame.function for frame in view.frames if frame.function in sites), None)] += sum(view.values)
                assert view.frames[0].function == "__schedule", "a wait's stack starts in the scheduler, not in the tracepoint's frames"
            elif kind == "lock_wake":
                waker, waiter = _split(view.frames)
                site = next((frame.function for frame in waiter if frame.function in sites), None)
                woke_in = next((frame.function for frame in waker if frame.function in wakers_of), None)
                marker = next(frame.function for frame in view.frames if frame.frame_type == MARKER_FRAME_TYPE)
                wakes[(site, view.attributes.get("lock.kind"), woke_in or marker)] += sum(view.values)
                if site:
                    folded[";".join(frame.function or "?" for frame in reversed(view.frames))] += sum(view.values)
                if marker == wakers.WOKEN_BY:
                    assert view.attributes["lock.waker.thread.id"] != view.attributes["thread.id"]
    print(f"the workload measured {figures}")
    print("the host's wakers, as counted:", {name: counters[name] for name in ("lock_waits", "lock_wakers", "lock_wakers_early", "lock_wakers_unseen", "lock_wakes_lost",
                                                                              "waits_throttled", "unwind_stack_collisions", "unwind_stack_map_full")})
    print(f"lock_wait by site: {dict(waits)}")
    print("lock_wake by (site, lock.kind, the waker's function):")
    for key, value in wakes.most_common():
        print(f"  {value / 1e6:10.2f} ms  {key}")
    print("ours, folded (the heaviest 8 stacks of the workload's sites, in ms):")
    for stack, value in folded.most_common(8):
        print(f"  {stack} {value / 1e6:.2f}")
    print("offwaketime-bpfcc -f -p PID on the same run (its values in us):")
    out, err = tool_output
    for line in sorted((line for line in out.splitlines() if line.strip()), key=lambda line: -int(line.rsplit(" ", 1)[-1]) if line.rsplit(" ", 1)[-1].isdigit() else 0)[:8]:
        print(f"  {line}")
    if err.strip():
        print("  (stderr) " + "\n  (stderr) ".join(err.strip().splitlines()[-4:]))

    mutex = sum(value for (site, kind, _), value in wakes.items() if site == "wait_for_the_lock" and kind == "mutex")
    held = wakes[("wait_for_the_lock", "mutex", "hold_the_lock")]
    assert held >= 0.9 * mutex, "the waker is the thread that held the lock, in hold_the_lock"
    assert abs(sum(value for (site, _, _), value in wakes.items() if site == "wait_for_the_lock") - waits["wait_for_the_lock"]) \
        <= 0.02 * waits["wait_for_the_lock"], "lock_wake holds lock_wait's time, no more, no less"
    assert abs(mutex - figures["mutex_wait_ns"]) <= 0.1 * figures["mutex_wait_ns"]
    condvar = sum(value for (site, kind, _), value in wakes.items() if site == "wait_for_the_signal" and kind == "condvar")
    assert wakes[("wait_for_the_signal", "condvar", "signal_later")] >= 0.9 * condvar
    assert abs(condvar - figures["condvar_wait_ns"]) <= 0.1 * figures["condvar_wait_ns"]
