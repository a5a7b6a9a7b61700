"""Process targeting (issue 16) with real BPF: process_filter and filter_min_process_age.

One receiver run with a command-line filter profiles a matching known_split started before the
receiver, one started after it, a Python process whose forked child never execs (the kernel makes
the child a target), and a busy known_split whose command line does not match: it must add no
sample and no entry to any of the program's maps. Another run with filter_min_process_age checks
a new process is profiled only once it is old enough.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time

import pytest

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, receiver_of, registry_with

from tests.conftest import WORKLOADS, bpf_unavailable_reason

pytestmark = pytest.mark.bpf

HZ = 199
MARKER = "pycollector-target-marker"
FORKING = """
import os, sys, time
def spin(seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        sum(range(1000))
child = os.fork()
spin(float(sys.argv[1]))
if child:
    os.waitpid(child, 0)
    print(child, flush=True)
"""


def receiver_config(settings: dict, capture_dir) -> dict:
    return {
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "500ms", "unwind_cache_dir": str(capture_dir / "cache"), **settings}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }


def samples_by_pid(messages) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for message in messages:
        for view in iter_samples(message):
            counts[view.resource.get("process.pid")] += sum(view.values)
    return counts


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    work = tmp_path_factory.mktemp("targeting")
    built = work / "known_split"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(built), str(WORKLOADS / "known_split.c")], check=True)
    return built


def test_only_processes_whose_command_line_matches_are_profiled(binary, tmp_path):
    # (killed at the end: they must outlast the program's compile, seconds on a busy machine)
    early = subprocess.Popen([str(binary), "60", MARKER], stdout=subprocess.DEVNULL)
    excluded = subprocess.Popen([str(binary), "60", "someone-else"], stdout=subprocess.DEVNULL)
    capture = CapturingExporterFactory()
    service = Service(build_plan(receiver_config({"process_filter": {"command_line": MARKER}}, tmp_path), registry_with(exporters={"capture": capture})))
    service.start()
    try:
        time.sleep(1.0)
        late = subprocess.Popen([str(binary), "3", MARKER], stdout=subprocess.DEVNULL)
        forking = subprocess.Popen([sys.executable, "-c", FORKING, "3", MARKER], stdout=subprocess.PIPE, text=True)
        time.sleep(2.0)
        sampler = receiver_of(service)._sampler
        known = {key.value for key in sampler._known.keys()}
        targets = {key.value for key in sampler.target_tgids.keys()}
        unwound = {key.value for key in sampler.unwind_maps.processes.keys()}
        for process in (late, forking):
            process.wait(timeout=30)
        child = int(forking.stdout.read().split()[0])
    finally:
        for process in (early, excluded):
            process.kill()
            process.wait()
        counters = receiver_of(service)._sampler.counters()
        service.shutdown()
    counts = samples_by_pid(capture.consumer.messages)
    print({"early": counts[early.pid], "late": counts[late.pid], "forking": counts[forking.pid], "child": counts[child],
           "excluded": counts[excluded.pid], "not_targeted": counters.get("not_targeted"), "forked": counters.get("targets_forked")})
    for name, pid in (("started before", early.pid), ("started after", late.pid), ("forking", forking.pid), ("its forked child", child)):
        assert counts[pid] >= HZ // 2, f"the matching process {name} the receiver was profiled"
    assert counts[excluded.pid] == 0, "the excluded process has samples"
    assert excluded.pid not in known | targets | unwound, "the excluded process has map entries"
    assert early.pid in targets and early.pid in known
    assert set(counts) <= {early.pid, late.pid, forking.pid, child}, f"unexpected processes {set(counts) - {early.pid, late.pid, forking.pid, child}}"
    assert counters["not_targeted"] > HZ, "the excluded busy process was sampled and left out by the kernel"
    assert counters["targets_forked"] >= 1


def test_a_new_process_is_profiled_once_it_is_old_enough(binary, tmp_path):
    capture = CapturingExporterFactory()
    service = Service(build_plan(receiver_config({"filter_min_process_age": "2s"}, tmp_path), registry_with(exporters={"capture": capture})))
    service.start()
    try:
        young = subprocess.Popen([str(binary), "4"], stdout=subprocess.DEVNULL)
        young.wait(timeout=30)
        time.sleep(0.6)
    finally:
        service.shutdown()
    counts = samples_by_pid(capture.consumer.messages)
    print(f"young: {counts[young.pid]} samples of about {4 * HZ} it could have had")
    assert counts[young.pid] >= HZ, "profiled once it was 2 s old (it ran 4 s)"
    assert counts[young.pid] <= 2.3 * HZ, "not before it was 2 s old (at most one 0.5 s report late)"
