"""The native heap sampler (sdk/native, libpycollector_heap.so), without BPF: what a program sees
under it is what it sees without it, its probes are where a profiler looks for them, and what the
probes would tell a profiler matches what the program really allocated.

"What the probes would tell" is read from the library's test trace (PYCOLLECTOR_HEAP_SAMPLE_TRACE:
both semaphores raised as an attached profiler raises them, one line per probe fired), so the
statistics are checked here on the sampler alone; the profiler's side has tests of its own.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.heap_samplers import Replay, assert_probes_and_semaphores, events, replay

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "sdk" / "native"
SOURCES = Path(__file__).resolve().parent / "native"
LOOP_SOURCE = REPO / "bench" / "heap_sampler.c"
FUNCTIONS = ("alloc_hot", "alloc_warm", "alloc_leaky")
SHARES = {"alloc_hot": 0.6, "alloc_warm": 0.3, "alloc_leaky": 0.1}
DEFAULT_INTERVAL = 524288
WORKLOAD_MIB = 192
# A small interval for the statistics: 192 MiB at 32 KiB is ~6,000 boundaries, so a function's
# share strays by ~0.6 point (one standard deviation) and the total by ~1.3%.
STATS_INTERVAL = 32768

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is missing")


@dataclasses.dataclass
class Built:
    library: Path
    workload: Path
    stress: Path
    semantics: Path
    loop: Path
    set_test: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    out = tmp_path_factory.mktemp("heap_sampler")
    made = subprocess.run(["make", "-s", "-C", str(NATIVE), f"OUT={out}"], capture_output=True, text=True)
    assert made.returncode == 0, f"building the sampler failed (sys/sdt.h comes with systemtap-sdt-dev, which scripts/setup.sh installs):\n{made.stderr}"

    def gcc(name: str, source: Path, *flags: str) -> Path:
        binary = out / name
        subprocess.run(["gcc", "-O2", "-g", "-Wall", "-o", str(binary), str(source), *flags], check=True, capture_output=True)
        return binary

    return Built(library=out / "libpycollector_heap.so",
                 workload=gcc("heap_workload", SOURCES / "heap_workload.c", "-rdynamic", "-lm"),
                 stress=gcc("heap_stress", SOURCES / "heap_stress.c", "-pthread"),
                 semantics=gcc("heap_semantics", SOURCES / "heap_semantics.c", "-Wno-alloc-size-larger-than", "-Wno-use-after-free"),
                 loop=gcc("heap_loop", LOOP_SOURCE),
                 set_test=gcc("heap_set_test", SOURCES / "heap_set_test.c", "-pthread", f"-I{NATIVE}"))


def run(command: list[str], library: Path | None = None, trace: Path | None = None, interval: int | str | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("LD_PRELOAD", "PYCOLLECTOR_HEAP_"))}
    if library:
        env["LD_PRELOAD"] = str(library)
    if trace:
        env["PYCOLLECTOR_HEAP_SAMPLE_TRACE"] = str(trace)
    if interval is not None:
        env["PYCOLLECTOR_HEAP_SAMPLE_BYTES"] = str(interval)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def workload_truth(printed: str) -> tuple[dict[str, int], int]:
    lines = dict(line.rsplit(" ", 1) for line in printed.splitlines())
    return {name: int(lines[f"bytes {name}"]) for name in FUNCTIONS}, int(lines["leaked"])


@pytest.fixture(scope="module")
def traced_workload(built, tmp_path_factory) -> tuple[str, Replay]:
    trace = tmp_path_factory.mktemp("trace") / "workload.trace"
    printed = run([str(built.workload), str(WORKLOAD_MIB)], built.library, trace, STATS_INTERVAL).stdout
    lines = events(trace)
    assert lines, "the trace is empty: the semaphores were not raised"
    return printed, replay(lines, lines[0][1])


def test_the_set_of_sampled_blocks(built):
    """sampled_set.h alone: runs wrapping around the table's end emptied in random order, random
    adds and removes against an array of the truth, and lock-free readers whose keys the writer
    shifts along one run (tests/native/heap_set_test.c)."""
    assert run([str(built.set_test)]).stdout == "ok\n"


def test_library_exports_only_the_malloc_family(built):
    lines = [line.split() for line in run(["nm", "-D", "--defined-only", str(built.library)]).stdout.splitlines()]
    exported = {fields[-1] for fields in lines if len(fields) == 3 and fields[1] in "TW"}
    assert exported == {"malloc", "calloc", "realloc", "reallocarray", "free", "free_sized", "free_aligned_sized", "posix_memalign", "aligned_alloc", "memalign", "valloc"}


def test_probes_and_semaphores_are_in_the_stapsdt_notes(built):
    assert_probes_and_semaphores(built.library)


def test_the_workload_sees_the_same_heap(built, tmp_path):
    """Checksums of the data written into every block and read back, the alignment of every aligned
    block, what realloc kept growing and shrinking, calloc's zeros, malloc_usable_size: the same
    without the library, with it and no profiler, and with a sample every ~4 KiB (many blocks
    sampled and remembered, so the free and realloc paths that look them up run too)."""
    command = [str(built.workload), "64"]
    alone = run(command).stdout
    assert "misaligned 0\nrealloc_mismatch 0\ncalloc_nonzero 0\nusable_short 0\nfailed 0" in alone
    assert run(command, built.library).stdout == alone
    trace = tmp_path / "trace"
    assert run(command, built.library, trace, 4096).stdout == alone
    assert len(events(trace)) > 500  # ~1,000: the blocks are large, most cross several boundaries


def test_errno_alignment_and_failures_are_the_allocators(built, tmp_path):
    """errno kept on success and set on failure, invalid alignments, overflowing calloc and
    reallocarray, realloc to 0, malloc_usable_size: the same with every allocation sampled."""
    alone = run([str(built.semantics)]).stdout
    assert run([str(built.semantics)], built.library).stdout == alone
    trace = tmp_path / "trace"
    assert run([str(built.semantics)], built.library, trace, 1).stdout == alone
    sampled = replay(events(trace), events(trace)[0][1])
    assert not sampled.problems
    # With one boundary a byte, every allocation's weight is its size.
    assert sampled.allocs and all(a.weight == a.size for a in sampled.allocs)


def test_sampled_bytes_follow_the_workloads_shares(traced_workload):
    printed, sampled = traced_workload
    truth, _ = workload_truth(printed)
    weights = sampled.weights()
    total_true, total_estimated = sum(truth.values()), sum(weights[name] for name in FUNCTIONS)
    for name in FUNCTIONS:
        assert truth[name] / total_true == pytest.approx(SHARES[name], abs=0.005)  # the workload's own split
        share = weights[name] / total_estimated
        assert share == pytest.approx(truth[name] / total_true, abs=0.03), f"{name}: {share:.3f} sampled, {truth[name] / total_true:.3f} true"
    assert total_estimated == pytest.approx(total_true, rel=0.10)
    assert all(a.weight % STATS_INTERVAL == 0 for a in sampled.allocs)


def test_free_fires_exactly_for_the_sampled_blocks_freed(traced_workload):
    """Every free fired is of a block sampled and not yet freed, and every sampled block the
    workload freed had its free fired: what is left is the leaker's, close to what it kept."""
    printed, sampled = traced_workload
    _, leaked = workload_truth(printed)
    assert not sampled.problems, sampled.problems[:5]
    assert sampled.frees > 100
    held = collections.Counter()
    for block in sampled.live.values():
        held[block.caller] += block.weight
    assert not {name for name in held if name in ("alloc_hot", "alloc_warm")}, f"freed functions still hold sampled blocks: {held}"
    assert held["alloc_leaky"] >= 0.9 * sum(held.values())
    assert held["alloc_leaky"] == pytest.approx(leaked, rel=0.15)


def test_small_allocations_are_weighed_without_bias(built, tmp_path):
    """2M malloc(64)/free: each far below the interval, sampled with probability ~64/4096 and
    weighed 4096; the weights add up to the bytes, and every sampled block's free fires."""
    trace = tmp_path / "trace"
    iterations = 2_000_000
    run([str(built.loop), str(iterations)], built.library, trace, 4096)
    sampled = replay(events(trace), events(trace)[0][1])
    assert not sampled.problems
    loop_blocks = [a for a in sampled.allocs if a.size == 64]
    assert sum(a.weight for a in loop_blocks) == pytest.approx(64 * iterations, rel=0.03)
    # Two boundaries within one block's 64 bytes happen too (~1 in 130 sampled blocks): weight 8192.
    assert all(a.weight % 4096 == 0 for a in loop_blocks)
    assert sum(a.weight == 4096 for a in loop_blocks) >= 0.97 * len(loop_blocks)
    assert not [a for a in sampled.live.values() if a.size == 64]


def test_the_default_interval_and_a_bad_setting(built, tmp_path):
    trace = tmp_path / "trace"
    done = run([str(built.workload), "64"], built.library, trace, "12k")
    assert "PYCOLLECTOR_HEAP_SAMPLE_BYTES is not a byte count" in done.stderr
    sampled = replay(events(trace), events(trace)[0][1])
    assert sampled.allocs and all(a.weight % DEFAULT_INTERVAL == 0 for a in sampled.allocs)
    truth, _ = workload_truth(done.stdout)
    # 64 MiB at 512 KiB: ~128 boundaries, one standard deviation ~9%.
    assert sum(sampled.weights()[name] for name in FUNCTIONS) == pytest.approx(sum(truth.values()), rel=0.4)


@pytest.mark.parametrize("traced", [False, True], ids=["no-profiler", "sampling-every-16KiB"])
def test_threads_and_forks_neither_crash_nor_hang(built, tmp_path, traced):
    """Four threads malloc/calloc/realloc/posix_memalign/free through shared slots (blocks freed and
    realloc'd by other threads) while the main thread forks four times; each child allocates,
    frees its copies of the parent's blocks and starts a thread. Sampled every ~16 KiB, the table
    of sampled blocks changes thousands of times a second across threads and forks."""
    trace = tmp_path / "trace" if traced else None
    done = run([str(built.stress), "200000"], built.library, trace, 16384 if traced else None, timeout=120)
    assert done.stdout.strip() == "ok"
    if not traced:
        return
    lines = events(trace)
    parent = lines[0][1]
    pids = {line[1] for line in lines}
    assert len(pids) == 5, f"expected the parent and 4 children in the trace, got {len(pids)}"
    sampled = replay(lines, parent)
    assert not sampled.problems, sampled.problems[:5]
    assert sampled.frees > 1000
    parent_blocks = {int(line[2], 16) for line in lines if line[0] == "alloc" and line[1] == parent}
    by_pid = collections.defaultdict(list)
    for line in lines:
        by_pid[line[1]].append(line)
    for pid in pids - {parent}:
        # A child starts with its parent's sampled blocks (which of them were alive at the fork is
        # not in the trace): its frees are of those or of its own.
        child = replay(by_pid[pid], pid, parent_blocks)
        assert not child.problems, (pid, child.problems[:5])
        assert child.frees > 0


PYTHON_PROGRAM = r"""
import hashlib, json, os, threading
document = {"items": [{"id": i, "name": "item %d" % i, "tags": ["x" * (i % 50)] * (i % 7)} for i in range(20000)]}
text = json.dumps(document, sort_keys=True)
back = json.loads(text)
blobs = []
def work(n):
    blobs.append(hashlib.sha256(b"".join(bytes([n]) * (1 << k) for k in range(18))).hexdigest())
threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
pid = os.fork()
if pid == 0:
    os._exit(0 if json.loads(json.dumps(back)) == document else 1)
_, status = os.waitpid(pid, 0)
print(hashlib.sha256(text.encode()).hexdigest(), sorted(blobs), back == document, os.waitstatus_to_exitcode(status))
"""


def test_python_runs_unchanged(built, tmp_path):
    """/usr/bin/python3 (pymalloc for small objects, malloc and realloc beneath), with threads and a
    fork: the same output, and sampled when the semaphores are up."""
    command = ["/usr/bin/python3", "-c", PYTHON_PROGRAM]
    alone = run(command).stdout
    assert alone.rstrip().endswith("True 0")
    assert run(command, built.library).stdout == alone
    trace = tmp_path / "trace"
    assert run(command, built.library, trace, 65536).stdout == alone
    lines = events(trace)
    sampled = replay(lines, lines[0][1])
    assert not sampled.problems
    assert len(sampled.allocs) > 20


CPP_PROGRAM = r"""
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
struct alignas(256) Wide { char bytes[1000]; };
int main() {
    std::vector<std::unique_ptr<Wide>> wides;
    std::vector<std::string> strings;
    int misaligned = 0;
    for (int i = 0; i < 20000; i++) {
        wides.emplace_back(new Wide());
        misaligned += reinterpret_cast<std::uintptr_t>(wides.back().get()) % 256 != 0;
        strings.emplace_back(std::string(16 + i % 5000, 'a' + i % 26));
        if (wides.size() > 64) { wides.clear(); strings.clear(); }
    }
    std::printf("misaligned %d\n", misaligned);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is missing")
def test_cpp_new_and_delete_go_through_it(built, tmp_path):
    source = tmp_path / "program.cc"
    source.write_text(CPP_PROGRAM)
    program = tmp_path / "program"
    subprocess.run(["g++", "-O2", "-std=c++17", "-o", str(program), str(source)], check=True, capture_output=True)
    alone = run([str(program)]).stdout
    assert alone == "misaligned 0\n"
    trace = tmp_path / "trace"
    assert run([str(program)], built.library, trace, 16384).stdout == alone
    lines = events(trace)
    sampled = replay(lines, lines[0][1])
    assert not sampled.problems
    callers = collections.Counter(a.caller for a in sampled.allocs)
    assert callers["_Znwm"] + callers["_ZnwmSt11align_val_t"] > 100, callers  # operator new, plain and aligned
    assert sampled.frees > 100


RUST_PROGRAM = r"""
use std::alloc::{alloc, dealloc, Layout};
fn main() {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let mut sum = 0usize;
    for i in 0..20000usize {
        let v = vec![(i % 251) as u8; 64 + (i * 37) % 8192];
        sum += v.iter().map(|&b| b as usize).sum::<usize>();
        kept.push(v);
        if kept.len() > 100 { kept.clear(); }
    }
    let layout = Layout::from_size_align(4096, 256).unwrap();
    let mut misaligned = 0;
    for _ in 0..1000 {
        unsafe { let p = alloc(layout); misaligned += (p as usize % 256 != 0) as usize; dealloc(p, layout); }
    }
    println!("{} misaligned {}", sum, misaligned);
}
"""


@pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc is missing")
def test_rust_system_allocator_goes_through_it(built, tmp_path):
    """Rust's default allocator calls malloc, posix_memalign (alignment 256 here), realloc, free."""
    source = tmp_path / "program.rs"
    source.write_text(RUST_PROGRAM)
    program = tmp_path / "program"
    subprocess.run(["rustc", "-O", "-o", str(program), str(source)], check=True, capture_output=True, cwd=tmp_path)
    alone = run([str(program)]).stdout
    assert alone.endswith(" misaligned 0\n")
    trace = tmp_path / "trace"
    assert run([str(program)], built.library, trace, 16384).stdout == alone
    sampled = replay(events(trace), events(trace)[0][1])
    assert not sampled.problems
    assert len(sampled.allocs) > 100 and sampled.frees > 100


UNSEEN_FREE_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
int main(void) {
    void *sampled = malloc(100);
    __libc_free(sampled);        /* a sampled block freed where the sampler cannot see */
    void *again = malloc(100);   /* libc hands the address out again, sampled again */
    free(again);
    void *unseen = __libc_malloc(100); /* and once more, to a block the sampler never saw */
    free(unseen);
    printf("%d %d\n", sampled == again, again == unseen);
}
"""


def test_a_block_freed_unseen_leaves_no_second_entry(built, tmp_path):
    """A sampled block freed through __libc_free leaves its entry; the address's next sampled
    block takes it over (one entry, not two), so its free fires once and a later free of an
    unsampled block at the same address fires nothing."""
    source = tmp_path / "unseen.c"
    source.write_text(UNSEEN_FREE_PROGRAM)
    program = tmp_path / "unseen"
    subprocess.run(["gcc", "-O1", "-o", str(program), str(source)], check=True, capture_output=True)
    trace = tmp_path / "trace"
    assert run([str(program)], built.library, trace, 1).stdout == "1 1\n"  # the same address throughout
    lines = events(trace)
    address = next(line[2] for line in lines if line[0] == "alloc" and line[3] == "100")
    assert [line[0] for line in lines if line[2] == address] == ["alloc", "alloc", "free"]


def test_many_sampled_blocks_freed_in_any_order(built, tmp_path):
    """~40,000 sampled blocks alive at once (the table of sampled blocks doubles from 512 slots to
    256 Ki), then freed in random order (deletions that shift entries back across the table's
    end): every one's free fires once, no other."""
    program = ("import random\n"
               "blocks = [bytearray(1000 + i % 7) for i in range(40000)]\n"  # > 512 B: malloc, not pymalloc
               "random.Random(1).shuffle(blocks)\n"
               "while blocks: blocks.pop()\n")
    trace = tmp_path / "trace"
    run(["/usr/bin/python3", "-c", program], built.library, trace, 256)
    lines = events(trace)
    sampled = replay(lines, lines[0][1])
    assert not sampled.problems, sampled.problems[:5]
    blocks = [a for a in sampled.allocs if 1001 <= a.size <= 1007]  # bytearray's buffer: one more byte
    assert len(blocks) > 35000  # each sampled with probability 1 - exp(-1001/256) = 0.98
    assert not [a for a in sampled.live.values() if 1001 <= a.size <= 1007]
