"""Node.js JavaScript frames walked and named without perf maps (issue 30, V8's first step): the
kernel records a JavaScript frame by the SharedFunctionInfo its JSFunction holds (bpf/v8.bpf.c),
and the report names it from the process's heap (receivers/profiling/v8/).

known_split.js runs under plain node (no --perf-basic-prof), in modes where each JavaScript
function runs in a frame of its own: interpreted and Sparkplug's baseline code (--no-opt), and
optimized code without inlining (--no-turbo-inlining). V8's own profile of the same run
(--cpu-prof) is the reference for the split. Functions inlined into optimized code are not
expanded yet (their time goes to the function they were inlined into); the default mode is
checked for whole, named stacks.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import time

import pytest

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, receiver_of, registry_with
from receivers.profiling.v8.detect import detect_v8
from receivers.profiling.v8.layout import UnknownLayout, V8Layout

from tests.conftest import WORKLOADS, bpf_unavailable_reason, share_tolerance

HZ = 199
SECONDS = 8
ROOTS = {"__libc_start_call_main", "__libc_start_main", "_start", "start_thread", "__clone3", "clone3"}


def node_binary() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node should be on this machine (scripts/setup.sh installs the runtimes' packages)")
    return os.path.realpath(node)


def test_the_node_binary_says_where_v8_keeps_a_frames_function():
    node = node_binary()
    fd = os.open(node, os.O_RDONLY)
    try:
        build = detect_v8(node, fd)
    finally:
        os.close(fd)
    said = subprocess.run([node, "-p", "process.versions.v8"], capture_output=True, text=True, check=True).stdout.strip()
    assert build is not None and build.layout is not None, build
    assert ".".join(map(str, build.version)) == ".".join(said.split(".")[:3])
    layout = build.layout
    # V8's x64 standard frame: context, then the JSFunction, below the saved frame pointer.
    assert (layout.fp_context, layout.fp_function) == (-8, -16)
    start, end = build.builtins_file_range()
    assert 0 < start < end and end - start == build.builtins[1] > 1 << 20


def test_a_build_with_pointer_compression_is_refused_by_name():
    values = {"TaggedSize": 4, "SmiShiftSize": 0}
    with pytest.raises(UnknownLayout, match="v8dbg_TaggedSize is 4"):
        V8Layout.from_symbols(values, (12, 4, 254))


def test_a_build_missing_a_field_without_fallback_is_refused_by_name():
    with pytest.raises(UnknownLayout, match="no v8dbg_type_JSFunction__JS_FUNCTION_TYPE"):
        V8Layout.from_symbols({}, (11, 3, 244))


def profile_node(tmp_path, flags: list[str]) -> tuple[dict, dict]:
    """known_split.js under node ``flags`` with V8's own profiler on, profiled by the receiver
    with no perf map: (what node's profile says, what the receiver exported for it)."""
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    node = node_binary()
    capture = CapturingExporterFactory()
    config = {
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "1s", "unwind_cache_dir": str(tmp_path / "cache")}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    try:
        process = subprocess.Popen([node, *flags, "--cpu-prof", "--cpu-prof-dir", str(tmp_path / "cpu-prof"), str(WORKLOADS / "known_split.js"),
                                    str(SECONDS)], stdout=subprocess.DEVNULL, cwd=tmp_path)
        process.wait(timeout=60)
        time.sleep(1.5)
        stats = dict(receiver_of(service).v8.stats)
    finally:
        service.shutdown()
    assert not (tmp_path / f"perf-{process.pid}.map").exists()
    (written,) = (tmp_path / "cpu-prof").iterdir()
    return json.loads(written.read_text()), {"pid": process.pid, "messages": capture.consumer.messages, "stats": stats}


def cpu_prof_leaves(profile: dict) -> collections.Counter:
    """V8's profile: samples by the function each was in (V8 counts a builtin's time to the
    JavaScript function that called it)."""
    names = {node["id"]: node["callFrame"]["functionName"] for node in profile["nodes"]}
    return collections.Counter(names[sample] for sample in profile["samples"])


def receiver_view(profiled: dict) -> tuple[collections.Counter, int, int]:
    """(samples by their innermost named JavaScript function, samples in all, samples whose stack
    ends at a thread's root)."""
    leaves, total, rooted = collections.Counter(), 0, 0
    for message in profiled["messages"]:
        for view in iter_samples(message):
            if view.resource.get("process.pid") != profiled["pid"] or not view.frames:
                continue
            count = sum(view.values)
            total += count
            rooted += count * (view.frames[-1].function in ROOTS)
            javascript = [frame for frame in view.frames if frame.frame_type == "v8js" and frame.function]
            if javascript:
                leaves[javascript[0].function] += count
    return leaves, total, rooted


def heavy_share(leaves: collections.Counter) -> tuple[float, int]:
    heavy, light = leaves["spinHeavy"], leaves["spinLight"]
    return heavy / max(1, heavy + light), heavy + light


@pytest.mark.bpf
@pytest.mark.parametrize("flags", [["--no-opt"], ["--no-turbo-inlining"]], ids=["interpreted-and-baseline", "optimized"])
def test_javascript_frames_are_named_without_a_perf_map_as_v8_profiles_them(tmp_path, flags):
    reference, profiled = profile_node(tmp_path, flags)
    leaves, total, rooted = receiver_view(profiled)
    ours, samples = heavy_share(leaves)
    theirs, reference_samples = heavy_share(cpu_prof_leaves(reference))
    print(f"node {' '.join(flags)}: {total} samples, {rooted / max(1, total):.1%} reach a root; spinHeavy {ours:.3f} of {samples} "
          f"(--cpu-prof {theirs:.3f} of {reference_samples}); commonest JavaScript leaves {leaves.most_common(5)}; {profiled['stats']}")
    assert samples >= HZ * SECONDS * 0.6
    assert rooted >= 0.95 * total
    both = 1 / (1 / samples + 1 / max(reference_samples, 1))
    assert abs(ours - theirs) <= share_tolerance(both)
    # The whole JavaScript stack, named: spinHeavy under runOnce under main.
    path = [frame.function for message in profiled["messages"] for view in iter_samples(message)
            if view.resource.get("process.pid") == profiled["pid"] for frame in view.frames
            if frame.frame_type == "v8js" and frame.function]
    assert {"spinHeavy", "spinLight", "runOnce", "main"} <= set(path)


@pytest.mark.bpf
def test_default_node_stacks_are_whole_and_named(tmp_path):
    """Optimized with inlining (spinHeavy and spinLight inlined into main's on-stack replacement
    code): the stacks still reach the root and name their JavaScript functions."""
    _, profiled = profile_node(tmp_path, [])
    leaves, total, rooted = receiver_view(profiled)
    print(f"node: {total} samples, {rooted / max(1, total):.1%} reach a root; JavaScript leaves {leaves.most_common(5)}; {profiled['stats']}")
    assert rooted >= 0.95 * total
    assert sum(leaves.values()) >= 0.8 * total
    assert leaves["main"] + leaves["spinHeavy"] + leaves["spinLight"] + leaves["runOnce"] >= 0.9 * sum(leaves.values())
