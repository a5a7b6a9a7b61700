"""The profiling receiver end to end: real BPF, real processes with known CPU profiles, and
assertions on the OTLP profiles it exports through a real pipeline.

One receiver run profiles several workloads at once (module fixture), then each test reads what
came out: the known 3:1 split, kernel frames under a syscall loop, 20 processes that each live
100 ms, a process inside a Kubernetes-style cgroup, and the wire format itself.
"""

from __future__ import annotations

import collections
import hashlib
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples, validate_indices
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, registry_with

from tests.conftest import WORKLOADS, bpf_unavailable_reason, share_tolerance

pytestmark = pytest.mark.bpf

HZ = 97
SHORT_LIVED = 20
CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
CONTAINER_ID = uuid.uuid4().hex + uuid.uuid4().hex  # 64 hex digits, as containerd's ids

SPIN_C = r"""
#include <stdlib.h>
#include <time.h>
static volatile unsigned long sink;
/* Spins for `seconds` of its own CPU time, so a busy machine delays it but cannot starve it of
 * samples. */
__attribute__((noinline)) void short_lived_spin(double seconds) {
    struct timespec t0, t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    unsigned long x = 1;
    do { for (int i = 0; i < 10000; i++) x = x * 6364136223846793005UL + 1; sink = x;
         clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); }
    while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
}
int main(int argc, char **argv) { short_lived_spin(argc > 1 ? atof(argv[1]) : 0.1); return 0; }
"""

SYSCALL_C = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
__attribute__((noinline)) void write_zeros(int fd, double seconds) {
    static char buffer[64];
    time_t end = time(NULL) + (time_t)seconds;
    while (time(NULL) < end) for (int i = 0; i < 1000; i++) write(fd, buffer, sizeof buffer);
}
int main(int argc, char **argv) { write_zeros(open("/dev/null", O_WRONLY), argc > 1 ? atof(argv[1]) : 3); return 0; }
"""


def compile_c(directory: Path, name: str, source: str | Path, *flags: str) -> Path:
    if isinstance(source, str):
        path = directory / f"{name}.c"
        path.write_text(source)
        source = path
    binary = directory / name
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", *flags, "-o", str(binary), str(source)], check=True)
    return binary


def make_pod_cgroup() -> Path:
    """A cgroup laid out as containerd's under Kubernetes with the systemd driver (cgroup v2)."""
    pod = f"kubepods-burstable-pod{uuid.uuid4().hex}.slice"
    path = CGROUP_ROOT / "kubepods.slice" / "kubepods-burstable.slice" / pod / f"cri-containerd-{CONTAINER_ID}.scope"
    path.mkdir(parents=True)
    return path


def remove_pod_cgroup(scope: Path) -> None:
    """Remove the scope and the parents this test created (a cgroup must be empty to go)."""
    for directory in (scope, scope.parent, scope.parent.parent, scope.parent.parent.parent):
        try:
            directory.rmdir()
        except OSError:
            break


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Run the receiver in a pipeline while the workloads run; return what it exported."""
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())  # conftest turns this into a failure when BPF is required
    work = tmp_path_factory.mktemp("workloads")
    known_split = compile_c(work, "known_split", WORKLOADS / "known_split.c")
    syscalls = compile_c(work, "syscall_loop", SYSCALL_C)
    spinner = compile_c(work, "spinner", SPIN_C)
    short_lived = []
    for index in range(SHORT_LIVED):
        copy = work / f"short_spin_{index:02d}"
        shutil.copy(spinner, copy)
        short_lived.append(copy)

    capture = CapturingExporterFactory()
    config = {
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "1s"}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    pod_cgroup = make_pod_cgroup()
    try:
        # The containerized process moves itself into its pod cgroup before exec'ing the work, as
        # a container runtime does, so its first sample already sees the cgroup.
        contained = subprocess.Popen(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$1" 2', str(pod_cgroup), str(spinner)])
        processes = {
            "known_split": subprocess.Popen([str(known_split), "5"], stdout=subprocess.DEVNULL),
            "syscall_loop": subprocess.Popen([str(syscalls), "3"]),
        }
        time.sleep(0.2)
        for binary in short_lived:  # one after the other: each lives ~100 ms
            subprocess.run([str(binary), "0.1"], check=True)
        # wait4 gives the CPU time each process really had: the yardstick for sample counts.
        cpu_seconds = {}
        for name, process in processes.items():
            _, _, usage = os.wait4(process.pid, 0)
            cpu_seconds[name] = usage.ru_utime + usage.ru_stime
        contained.wait(timeout=30)
    finally:
        service.shutdown()  # reports the last partial interval
        remove_pod_cgroup(pod_cgroup)
    return {"messages": capture.consumer.messages, "pids": {name: p.pid for name, p in processes.items()}, "cpu_seconds": cpu_seconds, "contained": contained.pid}


def samples_of(messages, pid):
    for message in messages:
        for view in iter_samples(message):
            if view.resource.get("process.pid") == pid:
                yield view


def total(views) -> int:
    """Samples in ``views`` (each view is a stack with its count)."""
    return sum(sum(view.values) for view in views)


def test_known_split_stacks_and_share(profiled):
    views = list(samples_of(profiled["messages"], profiled["pids"]["known_split"]))
    weights: collections.Counter = collections.Counter()
    for view in views:
        names = [frame.function for frame in view.frames]
        leaf = names[0] if names else ""
        if leaf == "spin_heavy":
            assert names[1:3] == ["run_once", "main"], names  # leaf first
        elif leaf == "spin_light":
            # run_once calls spin_light in tail position; at -O2 that is a jump, so run_once's
            # frame is gone and spin_light returns straight to main. The stack shows what ran.
            assert names[1:3] in (["run_once", "main"], ["main", "__libc_start_call_main"]), names
        weights[leaf] += sum(view.values)
    expected = profiled["cpu_seconds"]["known_split"] * HZ
    received = sum(weights.values())
    print(f"known_split: {received} samples received, {expected:.0f} expected (CPU seconds x {HZ} Hz)")
    # Each tick samples whatever runs on that CPU: on a shared CPU the count is binomial around
    # the expectation, so allow three standard deviations (and a little for the partial ticks).
    tolerance = 3 * expected**0.5 + 5
    assert abs(received - expected) <= tolerance, f"{received} samples for {expected:.0f} expected"
    total = weights["spin_heavy"] + weights["spin_light"]
    share = weights["spin_heavy"] / total
    assert abs(share - 0.75) <= share_tolerance(total), f"spin_heavy share {share:.3f} from {dict(weights)}"


def test_resource_sample_and_location_attributes(profiled):
    pid = profiled["pids"]["known_split"]
    # A CPU-bound process still enters the kernel now and then (exec, page faults, the timer),
    # so pick a sample taken in its own code: those stacks are all user frames.
    view = next(v for v in samples_of(profiled["messages"], pid) if v.frames and v.frames[0].function == "spin_heavy")
    assert view.resource["process.executable.name"] == "known_split"
    assert view.resource["process.executable.path"].endswith("/known_split")
    assert view.resource["host.name"] == os.uname().nodename
    assert view.attributes["thread.id"] == pid and view.attributes["thread.name"] == "known_split"
    assert {frame.frame_type for frame in view.frames} == {"native"}
    assert all(frame.build_id for frame in view.frames if frame.mapping_filename.endswith("/known_split"))
    profile = view.profile
    assert profile.period == 1_000_000_000 // HZ
    # Each of its mappings carries the file's ids, as OTel profiling conventions name them
    # (exact values: test_profiling_symbolizer), and the data names the conventions' release.
    binary = Path(view.resource["process.executable.path"]).read_bytes()
    htlhash = hashlib.sha256(binary[:4096] + binary[-4096:] + len(binary).to_bytes(8, "big")).hexdigest()[:32]
    for message in profiled["messages"]:
        dictionary = message.dictionary
        for resource_profiles in message.resource_profiles:
            assert resource_profiles.schema_url.startswith("https://opentelemetry.io/schemas/1.")
            assert all(scope.schema_url == resource_profiles.schema_url for scope in resource_profiles.scope_profiles)
        for mapping in dictionary.mapping_table:
            if dictionary.string_table[mapping.filename_strindex].endswith("/known_split"):
                entries = [dictionary.attribute_table[index] for index in mapping.attribute_indices]
                ids = {dictionary.string_table[entry.key_strindex]: entry.value.string_value for entry in entries}
                assert ids["process.executable.build_id.htlhash"] == htlhash
                assert len(ids["process.executable.build_id.gnu"]) == 40 and "process.executable.build_id.go" not in ids


def test_syscall_workload_has_kernel_frames_above_user_frames(profiled):
    views = list(samples_of(profiled["messages"], profiled["pids"]["syscall_loop"]))
    for view in views:  # leaf first: kernel frames, then (never again kernel) the user frames
        types = [frame.frame_type for frame in view.frames]
        kernel_frames = types.count("kernel")
        assert types == ["kernel"] * kernel_frames + ["native"] * (len(types) - kernel_frames), [(f.frame_type, f.function, hex(f.address), f.mapping_filename) for f in view.frames]
    in_kernel = [view for view in views if view.frames and view.frames[0].frame_type == "kernel"]
    assert total(in_kernel) >= 0.3 * total(views), "a write() loop spends most of its time in the kernel"
    # Most of them are the write loop; the rest are exec and the dynamic loader's page faults.
    writing = [view for view in in_kernel if "write_zeros" in [frame.function for frame in view.frames if frame.frame_type == "native"]]
    assert total(writing) >= 0.5 * total(in_kernel), [[f.function for f in view.frames] for view in in_kernel[:10]]
    kernel_names = {frame.function for view in writing for frame in view.frames if frame.frame_type == "kernel"}
    assert kernel_names & {"do_syscall_64", "ksys_write", "vfs_write", "entry_SYSCALL_64_after_hwframe"}, kernel_names


def test_every_short_lived_process_is_named_and_symbolized(profiled):
    seen = collections.defaultdict(set)
    for message in profiled["messages"]:
        for view in iter_samples(message):
            name = view.resource.get("process.executable.name", "")
            if name.startswith("short_spin_"):
                seen[name].update(frame.function for frame in view.frames)
    missing = [f"short_spin_{i:02d}" for i in range(SHORT_LIVED) if "short_lived_spin" not in seen.get(f"short_spin_{i:02d}", ())]
    assert not missing, f"not seen with short_lived_spin symbolized: {missing}"


def test_wire_format_decodes_with_official_classes_and_indices_hold(profiled):
    assert profiled["messages"]
    for message in profiled["messages"]:
        decoded = profiles_pb2.ProfilesData.FromString(message.SerializeToString())
        assert validate_indices(decoded) == []
        strings = decoded.dictionary.string_table
        for resource_profiles in decoded.resource_profiles:
            for scope in resource_profiles.scope_profiles:
                for profile in scope.profiles:
                    assert (strings[profile.sample_type.type_strindex], strings[profile.sample_type.unit_strindex]) == ("samples", "count")
                    assert (strings[profile.period_type.type_strindex], strings[profile.period_type.unit_strindex]) == ("cpu", "nanoseconds")


def test_process_in_a_pod_cgroup_gets_its_container_id(profiled):
    views = list(samples_of(profiled["messages"], profiled["contained"]))
    assert views, "the containerized spinner was not sampled"
    assert {view.resource.get("container.id") for view in views} == {CONTAINER_ID}
    others = {view.resource.get("container.id") for view in samples_of(profiled["messages"], profiled["pids"]["known_split"])}
    assert others == {None}
