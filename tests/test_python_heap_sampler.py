"""The Python heap sampler (sdk/python's pycollector_heap), without BPF: switched on by
PYCOLLECTOR_HEAP_SAMPLE_BYTES alone, its probes where a profiler looks for them, what a program
sees under it the same as without it, and what its probes would tell a profiler true to what the
program allocated, across threads (the RAW domain without the GIL) and forks.

"What the probes would tell" is read from the sampler's test trace (PYCOLLECTOR_HEAP_SAMPLE_TRACE,
shared with the native sampler: both semaphores raised as an attached profiler raises them, one
line per probe fired, the domain as the caller). Each program runs in a virtual environment with
the package installed as pip installs it, so site starts the sampler from its .pth file as in a
service. The profiler's side is tests/test_memory_profiling.py's.
"""

from __future__ import annotations

import ast
import collections
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from receivers.profiling.memory.probes import read_file_probes
from tests.heap_samplers import DEBIAN_PYTHON, assert_probes_and_semaphores, events, python_sampler_library, replay

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "sdk" / "native"
# The CPythons the package supports (setup.py: 3.8 and later): Debian's, and pyenv's where the host has them.
INTERPRETERS = ["debian"] + [f"3.{minor}" for minor in range(8, 14)]
DEFAULT_INTERVAL = 524288

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not Path(DEBIAN_PYTHON).exists(), reason="gcc or python3 is missing")


@pytest.fixture(scope="module")
def python(sdk_pythons) -> Path:
    return sdk_pythons("debian")


def run(python: Path, program: str, *args: str, interval: int | str | None = None, trace: Path | None = None,
        env: dict[str, str] | None = None, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
    """``program`` under ``python``; the sampler on when ``interval`` is given, the semaphores raised
    when ``trace`` is."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("LD_PRELOAD", "PYCOLLECTOR_HEAP_", "PYTHON"))}
    if interval is not None:
        clean["PYCOLLECTOR_HEAP_SAMPLE_BYTES"] = str(interval)
    if trace is not None:
        clean["PYCOLLECTOR_HEAP_SAMPLE_TRACE"] = str(trace)
    done = subprocess.run([str(python), "-c", program, *args], env={**clean, **(env or {})}, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"exited with {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def within(observed: float, expected: float, variance: float, sigmas: float = 5.0) -> bool:
    return abs(observed - expected) <= sigmas * math.sqrt(max(variance, 1.0))


STATE = "import sys\nprint('pycollector_heap' in sys.modules)\nimport pycollector_heap\nprint(pycollector_heap.stats())"


def test_the_extension_builds_with_its_probes_in_its_notes(python):
    """readelf finds otel_memory:alloc (3 arguments) and :free (1) with their semaphores, and the
    profiler's own reader (memory/probes.py) can read every argument: each in a register or at a
    register's offset, none relative to %rip."""
    library = python_sampler_library(python)
    arguments = assert_probes_and_semaphores(library)
    print("probes:", arguments)
    stats: dict[str, int] = {}
    fd = os.open(library, os.O_RDONLY)
    try:
        probes = read_file_probes(fd, stats)
    finally:
        os.close(fd)
    assert sorted((probe.name, len(probe.args)) for probe in probes) == [("alloc", 3), ("free", 1)]
    assert all(probe.semaphore_offset for probe in probes) and not stats.get("unsupported")


def test_one_variable_switches_it_on(python, tmp_path):
    """Unset: site does not even import it. Set: it is on at start-up, at that interval (a bad one
    is said on stderr and the default used). With the native sampler preloaded it stays off (both
    would count Python's large objects). `python -S` runs no .pth: off."""
    off = run(python, STATE).stdout.splitlines()
    assert off[0] == "False" and ast.literal_eval(off[1])["state"] == "off"
    on = run(python, STATE, interval=4096).stdout.splitlines()
    assert on[0] == "True" and ast.literal_eval(on[1]) == {"state": "on", "hooked": "raw", "interval": 4096, "samples": 0, "sampled_bytes": 0,
                                                           "frees": 0, "live": 0}
    bad = run(python, STATE, interval="12k")
    assert ast.literal_eval(bad.stdout.splitlines()[1])["interval"] == DEFAULT_INTERVAL
    assert "pycollector_heap: PYCOLLECTOR_HEAP_SAMPLE_BYTES is not a byte count from 1 to 2^40, using 524288: 12k" in bad.stderr
    no_site = subprocess.run([str(python), "-S", "-c", "import sys; print('pycollector_heap' in sys.modules)"], capture_output=True, text=True,
                             env={**os.environ, "PYCOLLECTOR_HEAP_SAMPLE_BYTES": "4096"})
    assert no_site.stdout == "False\n"

    subprocess.run(["make", "-s", "-C", str(NATIVE), f"OUT={tmp_path}"], check=True, capture_output=True)
    trace = tmp_path / "trace"
    native = run(python, "import json; json.loads(json.dumps([list(range(100))] * 1000))\n" + STATE, interval=4096, trace=trace,
                 env={"LD_PRELOAD": str(tmp_path / "libpycollector_heap.so")})
    assert ast.literal_eval(native.stdout.splitlines()[1])["state"] == "native sampler loaded"
    callers = {line[5] for line in events(trace) if line[0] == "alloc"}
    assert callers and not callers & {"raw", "mem", "obj"}, "only the native sampler fired"


LISTEN = r"""
import ctypes, json, sys, threading
from itertools import repeat
import pycollector_heap
# What the kernel does when a profiler attaches a uprobe with a ref_ctr_offset: the semaphores'
# counters in this process's copy of the library go up (and down when it detaches).
base = min(int(line.split("-")[0], 16) for line in open("/proc/self/maps") if pycollector_heap.__file__ in line)
semaphores = [ctypes.c_uint16.from_address(base + int(offset, 16)) for offset in sys.argv[1:3]]
raw = ctypes.CDLL(None)  # (a CDLL call releases the GIL)
raw.PyMem_RawMalloc.restype, raw.PyMem_RawMalloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
raw.PyMem_RawFree.argtypes = [ctypes.c_void_p]
steps = []

def step(name):
    stats = pycollector_heap.stats()
    steps.append((name, stats["hooked"], stats["samples"]))

def small_objects():
    for _ in repeat(None, 50000):  # 6.65 MB in 133-byte objects, and nothing else
        bytes(100)

step("started")
small_objects()
step("no profiler")
for semaphore in semaphores:
    semaphore.value += 1
step("attached")
if sys.argv[3] == "thread":  # the first RAW request after the attach from a thread without the GIL
    thread = threading.Thread(target=lambda: raw.PyMem_RawFree(raw.PyMem_RawMalloc(100000)))
    thread.start()
    thread.join()
    for _ in range(100):  # (bytecodes: the main thread runs the pending call between two)
        pass
    step("a thread's RAW request")
else:
    bytearray(100000)
    step("a RAW request")
small_objects()
step("small objects")
for semaphore in semaphores:
    semaphore.value -= 1
step("detached")  # (what was allocated between the two steps could still be sampled: from here, nothing)
small_objects()
step("small objects detached")
print(json.dumps(steps))
"""


@pytest.mark.parametrize("first", ["main", "thread"])
def test_mem_and_obj_are_hooked_once_a_profiler_listens(python, first):
    """With no profiler attached only RAW is hooked (CPython calls a MEM or OBJ hook through a
    pointer where it inlines pymalloc: that call is the cost of a hook) and nothing is sampled.
    Once the semaphores are raised as the kernel raises them for a profiler, the next RAW request
    hooks MEM and OBJ: made with the GIL, at once; from a thread without it, through a pending call
    the main thread runs between two bytecodes. Small objects are sampled from then on (6.6 MB at
    a 64 KiB interval: ~100), and no more once the semaphores are down again; the hooks stay."""
    symbols = dict(line.split()[::-2] for line in subprocess.run(["nm", str(python_sampler_library(python))], check=True,
                                                                   capture_output=True, text=True).stdout.splitlines() if len(line.split()) == 3)
    offsets = [symbols[f"otel_memory_{name}_semaphore"] for name in ("alloc", "free")]
    steps = {name: (hooked, samples) for name, hooked, samples in
             __import__("json").loads(run(python, LISTEN, *offsets, first, interval=65536).stdout)}
    print(steps)
    assert steps["started"] == steps["no profiler"] == ("raw", 0)
    assert steps["attached"] == ("raw", 0)
    hooked, samples = steps["a thread's RAW request" if first == "thread" else "a RAW request"]
    assert hooked == "raw mem obj" and samples <= 3
    hooked, small = steps["small objects"]
    assert hooked == "raw mem obj" and within(small - samples, 6.65e6 / 65536, 6.65e6 / 65536)
    hooked, detached = steps["detached"]
    assert hooked == "raw mem obj" and detached - small <= 3
    assert steps["small objects detached"] == ("raw mem obj", detached)


SEMANTICS = r"""
import ctypes, random, sys
api = ctypes.PyDLL(None, use_errno=True)
HUGE = 1 << 60

def functions(prefix):
    malloc, calloc, realloc, free = (getattr(api, prefix + name) for name in ("Malloc", "Calloc", "Realloc", "Free"))
    for function, arguments in ((malloc, [ctypes.c_size_t]), (calloc, [ctypes.c_size_t] * 2), (realloc, [ctypes.c_void_p, ctypes.c_size_t])):
        function.restype, function.argtypes = ctypes.c_void_p, arguments
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    return malloc, calloc, realloc, free

def errno_after(call, *arguments):
    ctypes.set_errno(4321)  # (ctypes puts it in errno around the call, and reads it back after)
    result = call(*arguments)
    return result, ctypes.get_errno()

PATTERN = bytes(range(251)) * 1200  # (made once: a pattern made per block would be most of what is traced)

def fill(p, size, seed):
    ctypes.memmove(p, PATTERN[seed % 251:], size)

def intact(p, size, seed):
    return ctypes.string_at(p, size) == PATTERN[seed % 251:seed % 251 + size]

for prefix in ("PyMem_Raw", "PyMem_", "PyObject_"):
    malloc, calloc, realloc, free = functions(prefix)
    out = []
    p, errno = errno_after(malloc, 1000); out.append(("malloc errno", errno)); free(p)
    p, errno = errno_after(malloc, 0); out.append(("malloc(0)", p is not None, errno)); free(p)
    p, errno = errno_after(calloc, 100, 10); out.append(("calloc zeros", ctypes.string_at(p, 1000) == bytes(1000), errno))
    _, errno = errno_after(free, p); out.append(("free errno", errno))
    out.append(("calloc overflow", calloc(1 << 62, 16)))
    failed, errno = errno_after(malloc, HUGE); out.append(("malloc huge", failed, errno))
    failed, errno = errno_after(calloc, HUGE, 1); out.append(("calloc huge", failed, errno))
    p, errno = errno_after(realloc, None, 500); out.append(("realloc(NULL)", p is not None, errno))
    fill(p, 500, 1)
    p, errno = errno_after(realloc, p, 100000); out.append(("grown", intact(p, 500, 1), errno))
    fill(p, 100000, 2)
    p, errno = errno_after(realloc, p, 10); out.append(("shrunk", intact(p, 10, 2), errno))
    q, errno = errno_after(realloc, p, HUGE); out.append(("realloc huge", q, intact(p, 10, 2), errno))
    p, errno = errno_after(realloc, p, 0); out.append(("realloc(p, 0)", p is not None, errno))
    free(p)
    free(None)
    # Blocks of every size class, grown and shrunk at random, their bytes checked throughout.
    rng, blocks, checked = random.Random(7), [], 0
    for i in range(1000):
        size = rng.choice((8, 24, 100, 512, 513, 4000, 70000, 300000))
        p = calloc(1, size) if i % 3 == 0 else malloc(size)
        fill(p, min(size, 64), i)
        blocks.append((p, min(size, 64), i))
        if rng.random() < 0.3:
            p, kept, seed = blocks.pop(rng.randrange(len(blocks)))
            new_size = rng.choice((1, 16, 600, 5000, 200000))
            p = realloc(p, new_size)
            checked += intact(p, min(kept, new_size), seed)
            blocks.append((p, min(kept, new_size), seed))
        if len(blocks) > 50:
            p, kept, seed = blocks.pop(rng.randrange(len(blocks)))
            checked += intact(p, kept, seed)
            free(p)
    for p, kept, seed in blocks:
        checked += intact(p, kept, seed)
        free(p)
    out.append(("blocks intact", checked))
    print(prefix, out)
"""


@pytest.mark.parametrize("version", INTERPRETERS)
def test_the_allocators_semantics_are_kept(sdk_pythons, tmp_path, version):
    """Through each domain's malloc, calloc, realloc and free (ctypes, so the sizes and pointers
    are the test's): errno kept on success and as the allocator set it on failure, malloc(0) and
    realloc(p, 0) giving a block, realloc(NULL, n), calloc's zeros, failures (overflow, 2^60
    bytes) NULL with the old block intact, contents kept through growing and shrinking: the same
    without the sampler, with it and no profiler, and with every byte a sampling boundary (each
    allocation sampled and remembered, so the free and realloc paths that look blocks up run)."""
    python = sdk_pythons(version)
    alone = run(python, SEMANTICS).stdout
    assert "('malloc errno', 4321)" in alone and "('grown', True, 4321)" in alone and "blocks intact" in alone
    assert run(python, SEMANTICS, interval=DEFAULT_INTERVAL).stdout == alone
    trace = tmp_path / "trace"
    assert run(python, SEMANTICS, interval=1, trace=trace).stdout == alone
    lines = events(trace)
    sampled = replay(lines, lines[0][1])
    assert not sampled.problems, sampled.problems[:5]
    assert all(a.weight == a.size for a in sampled.allocs), "one boundary a byte: every weight is its size"
    assert {a.caller for a in sampled.allocs} == {"raw", "mem", "obj"}


WORKLOAD = r"""
import hashlib, json, os, sys, threading
document = {"items": [{"id": i, "name": "item %d" % i, "tags": ["x" * (i % 50)] * (i % 7), "ratio": i / 7} for i in range(20000)]}
text = json.dumps(document, sort_keys=True)
back = json.loads(text)
grown = bytearray()
for i in range(2000):
    grown += bytes([i % 256]) * (i % 300)
    if i % 100 == 99:
        del grown[: len(grown) // 2]
words = " ".join(str(i) * (i % 9) for i in range(30000)).split()
table = {word: len(word) for word in words}
errors = []
for key in ("absent", 12, None):
    try:
        table[key]
    except KeyError as error:
        errors.append(repr(error))
try:
    bytearray(1 << 60)
except MemoryError as error:
    errors.append(type(error).__name__)
digests = [None] * 4
def encode(n):  # (each thread its own objects, strings and buffers, while the others run)
    digests[n] = hashlib.sha256(json.dumps([document["items"][n::4], bytearray(n) * 100000], default=len).encode()).hexdigest()
workers = [threading.Thread(target=encode, args=(n,)) for n in range(4)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, hashlib.sha256(json.dumps(json.loads(text)).encode()).hexdigest().encode())
    os._exit(0 if json.loads(json.dumps(back)) == document else 1)
os.close(write)
from_child = os.read(read, 100).decode()
_, status = os.waitpid(pid, 0)
print(hashlib.sha256(text.encode()).hexdigest(), from_child, back == document, len(grown), len(table), errors, digests, status)
raise ValueError("the workload's own exception, with its traceback")
"""


def test_a_workload_runs_unchanged(python, tmp_path):
    """JSON, strings, dicts, a bytearray grown and cut (realloc), exceptions caught (MemoryError
    from a failed allocation among them) and one not, threads and a fork: the same output, error
    and exit status without the sampler, with it and no profiler, and with a sample every ~4 KiB."""
    alone = run(python, WORKLOAD, check=False)
    assert alone.returncode == 1 and alone.stderr.rstrip().endswith("ValueError: the workload's own exception, with its traceback")
    assert "True" in alone.stdout and "MemoryError" in alone.stdout
    for settings in ({"interval": DEFAULT_INTERVAL}, {"interval": 4096, "trace": tmp_path / "trace"}):
        under = run(python, WORKLOAD, check=False, **settings)
        assert (under.returncode, under.stdout, under.stderr) == (alone.returncode, alone.stdout, alone.stderr), settings
    lines = events(tmp_path / "trace")
    parent = lines[0][1]
    sampled = replay(lines, parent)
    assert not sampled.problems, sampled.problems[:5]
    assert len(sampled.allocs) > 1000 and sampled.frees > 500
    assert len({line[1] for line in lines}) == 2, "the forked child sampled too"


KNOWN_SIZES = r"""
import ctypes, json, os, sys
import pycollector_heap
api = ctypes.PyDLL(None)
plan = json.loads(sys.argv[1])
for prefix, size, count in plan:
    malloc, free = getattr(api, prefix + "Malloc"), getattr(api, prefix + "Free")
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    for _ in range(count):
        free(malloc(size))
stats = pycollector_heap.stats()
print(json.dumps(stats), flush=True)
os._exit(0)  # (no shutdown: what the trace holds after the stats is a few lines at most)
"""
INTERVAL = 4096
# (domain, bytes, blocks): sizes no object of the interpreter's own takes here, so each sample of
# one of them is of this loop's; pymalloc serves those up to 512 from its arenas and passes the
# larger to PyMem_RawMalloc (our RAW hook again).
PLAN = [("PyMem_Raw", 451, 30000), ("PyMem_Raw", 4001, 4000), ("PyMem_", 487, 30000), ("PyMem_", 4002, 4000),
        ("PyObject_", 499, 30000), ("PyObject_", 4003, 4000), ("PyObject_", 1 << 20, 16)]
DOMAIN = {"PyMem_Raw": "raw", "PyMem_": "mem", "PyObject_": "obj"}


def test_samples_follow_the_bytes_allocated(python, tmp_path):
    """Blocks of known sizes through each domain at a 4 KiB interval: for each size, the sampled
    blocks number about count x P(a block holds a boundary), and their weights add up to about the
    bytes allocated (boundaries are a Poisson process over the bytes: 5 standard deviations);
    each weight a multiple of the interval; each sampled once, in the domain that was called (a
    large object through PyObject_Malloc is not sampled again in PyMem_RawMalloc beneath); every
    sampled block's free fired. stats() counts what the trace shows."""
    trace = tmp_path / "trace"
    printed = run(python, KNOWN_SIZES, __import__("json").dumps(PLAN), interval=INTERVAL, trace=trace).stdout
    stats = __import__("json").loads(printed)
    lines = events(trace)
    sampled = replay(lines, lines[0][1])
    assert not sampled.problems, sampled.problems[:5]
    by_size = collections.defaultdict(list)
    for alloc in sampled.allocs:
        by_size[alloc.size].append(alloc)
    for prefix, size, count in PLAN:
        blocks = by_size[size]
        assert {a.caller for a in blocks} == {DOMAIN[prefix]}, (size, collections.Counter(a.caller for a in blocks))
        assert all(a.weight % INTERVAL == 0 for a in blocks)
        hit = 1 - (1 - 1 / INTERVAL) ** size  # P(a block holds at least one boundary)
        boundaries = sum(a.weight for a in blocks) // INTERVAL
        print(f"{prefix}Malloc({size}) x {count}: {len(blocks)} sampled (expected {count * hit:.0f}), "
              f"{boundaries * INTERVAL} bytes estimated of {count * size}")
        assert within(len(blocks), count * hit, count * hit * (1 - hit)), size
        assert within(boundaries, count * size / INTERVAL, count * size / INTERVAL), size
        assert not [a for a in sampled.live.values() if a.size == size], "every sampled block's free fired"
    fired = len(sampled.allocs)
    assert fired - 20 <= stats["samples"] <= fired and stats["state"] == "on"
    assert 0 <= sum(a.weight for a in sampled.allocs) - stats["sampled_bytes"] <= 20 * (1 << 20)
    assert 0 <= sampled.frees - stats["frees"] <= 20 and abs(stats["live"] - len(sampled.live)) <= 20


FORK = r"""
import ctypes, os, sys
api = ctypes.PyDLL(None)
malloc, free = api.PyMem_RawMalloc, api.PyMem_RawFree
malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
kept = [malloc(100000) for _ in range(50)]  # sampled (each holds ~24 boundaries) and alive at the fork
pid = os.fork()
if pid == 0:
    for p in kept:
        free(p)
    os._exit(0)
_, status = os.waitpid(pid, 0)
for p in kept:
    free(p)
# libc's fork itself, so that parent and child go on with the same allocations (os.fork's
# interpreter work after the fork differs between them; here only the parent's pid is an int
# object to allocate): blocks whose sizes number them. On the same draws they would sample the
# same blocks, give or take the few bytes the pid took.
pid = ctypes.CDLL(None).fork()
for i in range(3000):
    free(malloc(512 + i))
if pid == 0:
    os._exit(0)
print(status, os.waitpid(pid, 0)[1])
"""


def test_a_forked_child_samples_with_its_own_draws(python, tmp_path):
    """The child frees its copies of the parent's sampled blocks (their frees fire, in the child)
    and samples blocks of its own; after a fork, parent and child making the same 3,000
    allocations sample different ones (the child draws anew: on its parent's generator state it
    would sample nearly the same)."""
    trace = tmp_path / "trace"
    assert run(python, FORK, interval=INTERVAL, trace=trace).stdout == "0 0\n"
    lines = events(trace)
    parent = lines[0][1]
    by_pid = collections.defaultdict(list)
    for line in lines:
        by_pid[line[1]].append(line)
    assert len(by_pid) == 3
    kept = {int(line[2], 16) for line in by_pid[parent] if line[0] == "alloc" and line[3] == "100000"}
    assert len(kept) == 50

    def inherited(child: str) -> set[int]:
        """Blocks the parent sampled before the child's first line: those alive at its fork are
        the child's too, and their frees fire there (ci7 of session 33: an object the parent's
        interpreter sampled between the forks, freed by both)."""
        first = lines.index(by_pid[child][0])
        return {int(line[2], 16) for line in lines[:first] if line[1] == parent and line[0] == "alloc"}

    replayed = {pid: replay(by_pid[pid], pid, inherited(pid) if pid != parent else frozenset()) for pid in by_pid}
    assert not any(r.problems for r in replayed.values()), {pid: r.problems[:5] for pid, r in replayed.items()}
    first_child, second_child = sorted(set(by_pid) - {parent}, key=lambda pid: lines.index(by_pid[pid][0]))
    assert sum(line[0] == "free" and int(line[2], 16) in kept for line in by_pid[first_child]) == 50, "the child's frees of inherited blocks fired"
    numbered = [{a.size for a in replayed[pid].allocs if 512 <= a.size < 3512 and a.caller == "raw"} for pid in (parent, second_child)]
    assert all(len(sizes) > 300 for sizes in numbered)  # (each sampled with probability 0.12 to 0.58)
    different = len(numbered[0] ^ numbered[1]) / len(numbered[0] | numbered[1])
    print(f"blocks sampled by one of parent and child only: {100 * different:.0f}%")
    assert different > 0.25, "the child drew its own boundaries"


THREADS = r"""
import collections, ctypes, os, sys, threading
raw = ctypes.CDLL(None)  # (a CDLL releases the GIL around each call: the threads allocate at once)
malloc, free = raw.PyMem_RawMalloc, raw.PyMem_RawFree
malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
shared = collections.deque()
ITERATIONS = int(sys.argv[1])

def work(n):
    for i in range(ITERATIONS):
        shared.append(malloc(1000 + n))
        if len(shared) > 64:
            try:
                free(shared.popleft())  # (often another thread's block)
            except IndexError:
                pass

threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
[t.start() for t in threads]
statuses = []
for _ in range(8):  # forks while the threads allocate: the table's lock is taken around each
    pid = os.fork()
    if pid == 0:
        for i in range(2000):
            free(malloc(2000 + i % 7))
        os._exit(0)
    statuses.append(os.waitpid(pid, 0)[1])
[t.join() for t in threads]
while shared:
    free(shared.pop())
print(statuses)
"""


def test_threads_allocate_and_free_without_the_gil(python, tmp_path):
    """Four threads allocate and free through PyMem_RawMalloc/PyMem_RawFree with the GIL released
    (so at once), freeing each other's blocks, at a 256-byte interval (most blocks sampled: the
    set of sampled blocks changes from every thread), while the main thread forks eight children
    that allocate in their turn. No crash, no hang; every free fired is of a block sampled and
    alive; the weights add up to the bytes; no sampled block is left."""
    trace = tmp_path / "trace"
    iterations = 20000
    done = run(python, THREADS, str(iterations), interval=256, trace=trace, timeout=300)
    assert done.stdout == "[0, 0, 0, 0, 0, 0, 0, 0]\n"
    lines = events(trace)
    parent = lines[0][1]
    sampled = replay(lines, parent)
    assert not sampled.problems, sampled.problems[:5]
    blocks = [a for a in sampled.allocs if 1000 <= a.size < 1004 and a.caller == "raw"]
    allocated = sum((1000 + n) * iterations for n in range(4))
    print(f"{len(blocks)} blocks sampled of {4 * iterations}, {sum(a.weight for a in blocks)} bytes estimated of {allocated}")
    assert within(sum(a.weight for a in blocks) / 256, allocated / 256, allocated / 256)
    assert not [a for a in sampled.live.values() if 1000 <= a.size < 1004 and a.caller == "raw"]
    children = {line[1] for line in lines} - {parent}
    assert len(children) == 8
    inherited = {int(line[2], 16) for line in lines if line[0] == "alloc" and line[1] == parent}
    for child in children:
        replayed = replay(lines, child, inherited)
        assert not replayed.problems and len(replayed.allocs) > 1000, (child, replayed.problems[:5])


def test_the_json_benchmark_runs_each_mode(capsys):
    """bench/python_heap_sampler.py on its smallest sizes, a smoke test of each mode (sampler off,
    on with no profiler, semaphores raised): the figures come from running it, nothing here times
    them (a timed assertion would fail on a loaded host, not on a slow sampler)."""
    from bench.python_heap_sampler import measure

    times = measure(rounds=1, iterations=1)
    assert len(times) == 3 and all(len(values) == 1 and min(values) > 0 for values in times.values()), times
