"""Go, Node.js and Java frames named (issue 14), with real BPF: one receiver run profiles a stripped
Go build of known_split.go, known_split.js under node --perf-basic-prof and KnownSplit.java, whose
perf map the receiver asks the JVM for (jvm_perf_map_interval), each with its known 75/25 split. perf records the Node process
in the same run, reading the same perf map: the reference for JIT frames.

Both JITs inline small hot functions into their callers, and a perf map names compiled code, not
what was inlined into it: V8 inlines spinHeavy and spinLight into main (perf, reading the same map,
then puts 99.7% of samples in main), so Node runs with --no-turbo-inlining and the JVM with
inlining of KnownSplit's methods turned off, as someone reading a perf-map profile would.
"""

from __future__ import annotations

import collections
import io
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from exporters.debug.config import DebugConfig
from exporters.debug.exporter import DebugExporter
from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, TestHost, make_settings, registry_with

from tests.conftest import WORKLOADS, bpf_unavailable_reason, build_go_program, perf_leaves, share_tolerance

pytestmark = pytest.mark.bpf

HZ = 499
SECONDS = 8


def build_java(work: Path) -> Path:
    classes = work / "java"
    classes.mkdir()
    subprocess.run(["javac", "-d", str(classes), str(WORKLOADS / "KnownSplit.java")], check=True, capture_output=True)
    return classes


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    for tool in ("go", "node", "java", "javac", "perf"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} should be on this machine (scripts/setup.sh installs the runtimes' packages)")
    work = tmp_path_factory.mktemp("runtimes")
    go_binary = build_go_program(WORKLOADS / "known_split.go", work / "known_split_go", "-ldflags=-s -w")
    classes = build_java(work)
    capture = CapturingExporterFactory()
    config = {
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "1s", "unwind_cache_dir": str(work / "cache"),
                                   # a JVM writes its perf map when asked, with what it compiled by then
                                   "jvm_perf_map_interval": "3s"}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    running: dict[str, subprocess.Popen] = {}
    try:
        running["go"] = subprocess.Popen([str(go_binary), str(SECONDS)], stdout=subprocess.DEVNULL)
        running["node"] = subprocess.Popen(["node", "--perf-basic-prof", "--no-turbo-inlining", str(WORKLOADS / "known_split.js"), str(SECONDS)],
                                           stdout=subprocess.DEVNULL, cwd=work)  # (node writes a v8 log where it runs)
        running["java"] = subprocess.Popen(["java", "-XX:+PreserveFramePointer", "-XX:CompileCommand=quiet", "-XX:CompileCommand=dontinline,KnownSplit::*",
                                            "-cp", str(classes), "KnownSplit", str(SECONDS)], stdout=subprocess.DEVNULL)
        time.sleep(1.5)  # the JITs have compiled the hot functions
        perf_data = work / "node.perf"
        perf = subprocess.Popen(["perf", "record", "-F", str(HZ), "-g", "-p", str(running["node"].pid), "-o", str(perf_data), "--", "sleep", str(SECONDS - 3)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        perf.wait(timeout=SECONDS * 3)
        for name, process in running.items():
            process.wait(timeout=SECONDS * 5)
            assert process.returncode == 0, f"{name} failed"
        time.sleep(0.2)
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
        service.shutdown()
    return {"messages": capture.consumer.messages, "pids": {name: process.pid for name, process in running.items()}, "perf": perf_data}


def leaves(profiled, pid: int) -> collections.Counter:
    """Samples by their innermost user frame, (name, frame type)."""
    out: collections.Counter = collections.Counter()
    for message in profiled["messages"]:
        for view in iter_samples(message):
            if view.resource.get("process.pid") == pid:
                user = [frame for frame in view.frames if frame.frame_type != "kernel"]
                if user:
                    out[(user[0].function, user[0].frame_type)] += sum(view.values)
    return out


# Where a whole stack ends: a program's entry, a thread's root, a goroutine's.
ROOTS = {"_start", "__libc_start_main", "__libc_start_call_main", "start_thread", "__clone3", "clone3", "__clone",
         "runtime.goexit", "runtime.mstart", "runtime.rt0_go", "runtime.mcall"}


def rooted(profiled, pid: int) -> tuple[float, collections.Counter]:
    """The share of the process's samples whose outermost frame is a root, and the outermost
    frames of the others."""
    total, unrooted = 0, collections.Counter()
    for message in profiled["messages"]:
        for view in iter_samples(message):
            if view.resource.get("process.pid") == pid and view.frames:
                total += sum(view.values)
                if view.frames[-1].function not in ROOTS:
                    unrooted[view.frames[-1].function or hex(view.frames[-1].address)] += sum(view.values)
    return (1 - sum(unrooted.values()) / total if total else 0.0), unrooted


@pytest.mark.parametrize("runtime", ["go", "node", "java"])
def test_stacks_reach_their_root(profiled, runtime):
    share_rooted, unrooted = rooted(profiled, profiled["pids"][runtime])
    print(f"{runtime}: {share_rooted:.1%} of samples end at a root; others end at {unrooted.most_common(4)}")
    assert share_rooted >= 0.95


def share(counts: collections.Counter, heavy: str, light: str) -> tuple[float, int]:
    heavy_count = sum(count for (name, _), count in counts.items() if name and heavy in name)
    light_count = sum(count for (name, _), count in counts.items() if name and light in name)
    total = heavy_count + light_count
    return (heavy_count / total if total else 0.0), total


def test_a_stripped_go_binary_is_named_from_its_pclntab(profiled):
    counts = leaves(profiled, profiled["pids"]["go"])
    heavy, samples = share(counts, "main.spinHeavy", "main.spinLight")
    print(f"go: {samples} samples, main.spinHeavy {heavy:.3f}; commonest leaves {counts.most_common(4)}")
    assert samples >= HZ
    assert abs(heavy - 0.75) <= share_tolerance(samples)
    types = {kind for (name, kind) in counts if name and name.startswith("main.")}
    assert types == {"go"}, counts.most_common(6)
    named = sum(count for (name, _), count in counts.items() if name)
    assert named >= 0.99 * sum(counts.values()), counts.most_common(6)


def test_node_jit_frames_are_named_from_the_perf_map(profiled):
    counts = leaves(profiled, profiled["pids"]["node"])
    heavy, samples = share(counts, "spinHeavy", "spinLight")
    reference, reference_samples = share(collections.Counter({(leaf, ""): count for leaf, count in perf_leaves(profiled["perf"]).items()}), "spinHeavy", "spinLight")
    print(f"node: {samples} samples, spinHeavy {heavy:.3f} (perf {reference:.3f} of {reference_samples}); commonest leaves {counts.most_common(4)}")
    assert samples >= HZ
    assert abs(heavy - 0.75) <= share_tolerance(samples)
    both = 1 / (1 / samples + 1 / max(reference_samples, 1))
    assert abs(heavy - reference) <= share_tolerance(both)
    assert {kind for (name, kind) in counts if name and "spinHeavy" in name} == {"v8js"}


def test_java_jit_frames_are_named_from_the_perf_map(profiled):
    counts = leaves(profiled, profiled["pids"]["java"])
    heavy, samples = share(counts, "spinHeavy", "spinLight")
    print(f"java: {samples} samples, spinHeavy {heavy:.3f}; commonest leaves {counts.most_common(4)}")
    assert samples >= HZ, "the receiver asked the JVM for its perf map early in the run, and again"
    assert abs(heavy - 0.75) <= share_tolerance(samples)
    assert {kind for (name, kind) in counts if name and "spinHeavy" in name} == {"jvm"}


def test_the_debug_exporter_shows_each_runtime_as_its_instrumentation(profiled):
    output = io.StringIO()
    exporter = DebugExporter(make_settings("exporters", "debug"), DebugConfig(verbosity="detailed", sampling_initial=10_000), output=output)
    exporter.start(TestHost())
    for message in profiled["messages"]:
        exporter.consume(message)
    exporter.shutdown()
    text = output.getvalue()
    for kind, function in (("go", "main.spinHeavy"), ("v8js", "spinHeavy"), ("jvm", "spinHeavy")):
        assert any(line.strip().startswith(f"Instrumentation: {kind}, Function: ") and function in line for line in text.splitlines()), kind
