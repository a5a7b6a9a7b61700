"""deploy/systemd/pycollector.service: systemd accepts it, rates its hardening, and the
capabilities it grants (and the DaemonSet's) are enough to profile an ordinary user's processes
and no more, shown by running the collector the way the unit would: as an unprivileged user
holding exactly those capabilities (no systemd runs as PID 1 here, so the unit itself cannot be
started), and as the DaemonSet's container would: root with its capabilities cut."""

from __future__ import annotations

import configparser
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from pycollector.otlp.json_codec import from_json
from pycollector.pdata import iter_samples
from opentelemetry.proto.profiles.v1development.profiles_pb2 import ProfilesData

from tests.conftest import WORKLOADS
from tests.deployments import DEPLOYMENTS, DYNAMIC_USER, run_as_deployed, unit_bpf_cache, unit_capabilities, unit_service_section as service_section

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "deploy" / "systemd" / "pycollector.service"
CONFIG = REPO / "deploy" / "systemd" / "config.yaml"
SYSTEM_UNITS = next((path for path in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if path.is_dir()), None)
PYCOLLECTOR = Path(sys.executable).parent / "pycollector"

needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None or SYSTEM_UNITS is None,
                                           reason="systemd-analyze is missing (Debian package systemd; scripts/setup.sh installs it)")


@pytest.fixture
def unit_root(tmp_path) -> Path:
    """A file system root holding the unit, systemd's own units and a stand-in for ExecStart's
    program (verify checks that it exists), so the checks read the unit as installed."""
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(UNIT, root / "etc/systemd/system" / UNIT.name)
    program = root / service_section()["ExecStart"].split()[0].lstrip("/")
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return root


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_unit(unit_root):
    done = subprocess.run(["systemd-analyze", "verify", f"--root={unit_root}", f"/etc/systemd/system/{UNIT.name}"], capture_output=True, text=True, timeout=60)
    # Unknown keys and unparsable values are only warnings: any output at all fails the test.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@needs_systemd_analyze
def test_systemd_analyze_security_rates_the_hardening_ok(unit_root):
    """Exposure 3.0 of 10 with systemd 252 ("OK"); the threshold leaves room for other versions."""
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=45", f"--root={unit_root}", f"/etc/systemd/system/{UNIT.name}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


GATEWAY_UNIT = REPO / "deploy" / "systemd" / "pycollector-gateway.service"
GATEWAY_CONFIG = REPO / "deploy" / "systemd" / "gateway.yaml"


@needs_systemd_analyze
def test_the_gateway_unit_is_accepted_runs_its_config_in_workers_and_grants_nothing(unit_root, cli):
    shutil.copy(GATEWAY_UNIT, unit_root / "etc/systemd/system" / GATEWAY_UNIT.name)
    done = subprocess.run(["systemd-analyze", "verify", f"--root={unit_root}", f"/etc/systemd/system/{GATEWAY_UNIT.name}"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str
    parser.read_string(GATEWAY_UNIT.read_text())
    service = parser["Service"]
    assert service["ExecStart"].split()[1:] == ["--config", f"/etc/pycollector/{GATEWAY_CONFIG.name}"]
    assert service["AmbientCapabilities"] == service["CapabilityBoundingSet"] == "" and service["KillMode"] == "mixed"
    assert cli("validate", "--config", str(GATEWAY_CONFIG)).returncode == 0
    config = yaml.safe_load(GATEWAY_CONFIG.read_text())
    assert config["service"]["workers"] == "auto"
    assert config["extensions"]["file_storage"]["directory"].startswith(f"/var/lib/{service['StateDirectory']}/")


def test_the_unit_runs_the_config_it_names_and_keeps_its_state_where_the_config_says(cli):
    service = service_section()
    assert service["ExecStart"].split()[1:] == ["--config", "/etc/pycollector/config.yaml"]
    assert cli("validate", "--config", str(CONFIG)).returncode == 0
    config = yaml.safe_load(CONFIG.read_text())
    assert config["receivers"]["profiling"]["unwind_cache_dir"].startswith(f"/var/cache/{service['CacheDirectory']}/")
    assert config["extensions"]["file_storage"]["directory"].startswith(f"/var/lib/{service['StateDirectory']}/")
    assert set(service["AmbientCapabilities"].split()) == set(service["CapabilityBoundingSet"].split())


# A workload whose Python frames and native frames the collector must name.
WORKLOAD = """
import time
def spin_heavy(deadline):
    while time.monotonic() < deadline:
        sum(i * i for i in range(1000))
spin_heavy(time.monotonic() + 40)
"""
WORKLOAD_USER = 4242  # an ordinary user: no file of it exists, and the agent is not it
C_ENTRY = {"main", "__libc_start_call_main", "__libc_start_main", "_start"}
# A stripped program at a fixed address (non-PIE), so a perf map can name its code.
SPIN_C = r"""
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) void spin(void) { for (int i = 0; i < 100000; i++) sink += i * 7; }
int main(int argc, char **argv) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do { spin(); clock_gettime(CLOCK_MONOTONIC, &now); } while (now.tv_sec - start.tv_sec < atoi(argv[1]));
    return 0;
}
"""


@pytest.mark.bpf
@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_as_deployed_the_agent_names_an_ordinary_users_processes_and_reads_nothing_it_could_not(tmp_path, deployment):
    """The collector runs as ``deployment`` runs it (tests/deployments.py: the unit's dynamic user
    with its ambient capabilities, or the DaemonSet's root with its capabilities cut), its
    LimitMEMLOCK and NoNewPrivileges. The workloads are an ordinary user's: a C program without
    frame pointers (its frames named and walked to main: symbols and unwind rows from a file
    opened as that user), a CPython program from a binary deleted once started, in a mount
    namespace of its own (Python frames: /proc/PID/mem; native frames: /proc/PID/map_files), and a
    stripped program whose perf map is a root-only file naming it, bind-mounted there: not read,
    since the user could not read it (the agent itself could). Kernel frames are named (CAP_SYSLOG)."""
    service = service_section()
    # LimitMEMLOCK=infinity, as far as this machine lets the test raise it (a sandbox may not grant
    # CAP_SYS_RESOURCE: then the hard limit it has, 8 MiB here, which is enough on two CPUs).
    assert service["LimitMEMLOCK"] == "infinity"
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    memlock = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)

    work = Path(tempfile.mkdtemp(prefix="pycollector-unit-"))  # not under pytest's 0700 folders
    work.chmod(0o755)
    if deployment == "systemd":
        os.chown(work, DYNAMIC_USER, DYNAMIC_USER)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {"profiling": {"samples_per_second": 99, "reporter_interval": "1s", "unwind_cache_dir": str(work / "cache"),
                                    **({"bpf_cache_dir": unit_bpf_cache()} if deployment == "systemd" else {})}},
        "exporters": {"file": {"path": str(work / "profiles.jsonl"), "flush_interval": "200ms"}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["file"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }))
    (tmp_path / "workload.py").write_text(WORKLOAD)
    programs = Path(tempfile.mkdtemp(prefix="pycollector-user-", dir="/var/tmp"))
    programs.chmod(0o755)
    known_split = _compile((WORKLOADS / "known_split.c").read_text(), programs / "known_split", "-fomit-frame-pointer")
    spin = _compile(SPIN_C, programs / "spin", "-no-pie", "-s")
    token = f"ROOTONLY{secrets.token_hex(6)}"
    canary = programs / "canary"
    canary.write_text(f"401000 100000 {token}\n")
    canary.chmod(0o600)
    future = time.time() + 3600  # newer than the process: not refused as a stale map
    os.utime(canary, (future, future))
    as_user = ["setpriv", f"--reuid={WORKLOAD_USER}", f"--regid={WORKLOAD_USER}", "--clear-groups"]
    log = (tmp_path / "collector.log").open("w")
    collector = None
    workloads: list[subprocess.Popen] = []
    try:
        collector = subprocess.Popen(
            ["prlimit", f"--memlock={memlock}:{memlock}", "--", *run_as_deployed(deployment), str(PYCOLLECTOR), "--config", str(config)],
            cwd=work, stdout=log, stderr=subprocess.STDOUT)
        _wait_for_start(collector, tmp_path / "collector.log")
        python = Path(os.path.realpath("/usr/bin/python3"))
        workloads.append(subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec",
                                           'mount -t tmpfs tmpfs /mnt; cp "$0" /mnt/; cp "$1" /mnt/workload.py; '
                                           f'exec {" ".join(as_user)} "/mnt/${{0##*/}}" /mnt/workload.py',
                                           str(python), str(tmp_path / "workload.py")]))
        binary = f"/mnt/{python.name}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _exe_is(workloads[0].pid, binary):
            time.sleep(0.05)
        assert _exe_is(workloads[0].pid, binary)
        time.sleep(0.3)  # the script is read and running
        os.unlink(f"/proc/{workloads[0].pid}/root{binary}")
        workloads.append(subprocess.Popen([*as_user, str(known_split), "40"], stdout=subprocess.DEVNULL))
        # Its /tmp is its own: the perf map there is root's file, bind-mounted (a user does that in
        # a user namespace of its own, which this machine may not allow: the test is root).
        workloads.append(subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec",
                                           f'mount -t tmpfs tmpfs /tmp; touch /tmp/perf-$$.map; mount --bind {canary} /tmp/perf-$$.map; '
                                           f'exec {" ".join(as_user)} {spin} 40']))
        seen = _wait_for_names(work / "profiles.jsonl", [w.pid for w in workloads], binary, token, collector,
                               tmp_path / "collector.log", timeout=40)
        collector.send_signal(signal.SIGINT)
        assert collector.wait(timeout=20) == 0, (tmp_path / "collector.log").read_text()
    finally:
        for workload in workloads:
            workload.kill()
            workload.wait()
        if collector is not None and collector.poll() is None:
            collector.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(programs, ignore_errors=True)
    output = (tmp_path / "collector.log").read_text()
    assert "Permission denied" not in output and "refuses" not in output and "without CAP_" not in output, output
    assert seen["named"] == {"python": True, "native": True, "kernel": True}, (seen, output)
    c_samples, c_named, c_at_entry = seen["c"]
    assert c_samples >= 100 and c_named / c_samples >= 0.95 and c_at_entry / c_samples >= 0.9, (seen, output)
    assert seen["spin_samples"] > 0 and not seen["token"], seen


def _compile(source: str, out: Path, *flags: str) -> Path:
    out.with_suffix(".c").write_text(source)
    subprocess.run(["gcc", "-O2", *flags, "-o", str(out), str(out.with_suffix(".c"))], check=True, capture_output=True)
    out.chmod(0o755)
    return out


def _wait_for_start(collector, log: Path, timeout: float = 120) -> None:
    """Until the collector says it started (it compiles its BPF program first: seconds, more on
    a loaded machine), so the workloads' time is spent being profiled."""
    deadline = time.monotonic() + timeout
    while "pycollector started" not in log.read_text():
        assert collector.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


def _exe_is(pid: int, path: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe").startswith(path)
    except OSError:
        return False


def _wait_for_names(path: Path, pids: list[int], binary: str, token: str, collector, log: Path, timeout: float) -> dict:
    """What came out for the workloads (``pids``: the Python one, the C one, the stripped one):
    whether the Python frames (spin_heavy), the native frames in the deleted binary and anyone's
    kernel frames were named; the C program's samples (all, with a named leaf, reaching its entry)
    from the report after the first that had one reaching its entry (until its unwind rows are in
    the kernel its stacks stop short, and that first report may hold such samples: ci26 counted
    84 of 102 from it and the next); the stripped program's samples and whether ``token`` named
    anything. Waits until all are named and the C program has 100 samples so counted, or the time
    is up."""
    python_pid, c_pid, spin_pid = pids
    seen = {"named": {"python": False, "native": False, "kernel": False}, "c": [0, 0, 0], "spin_samples": 0, "token": False}
    reached = counting = False
    read = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (all(seen["named"].values()) and seen["c"][0] >= 100):
        assert collector.poll() is None, log.read_text()
        time.sleep(0.5)
        if not path.exists():
            continue
        text = path.read_bytes()
        complete = text[:text.rfind(b"\n") + 1].splitlines()  # a line being written is left for later
        for line in complete[read:]:
            views = list(iter_samples(from_json(line, ProfilesData)))
            c_views = [view for view in views if view.resource.get("process.pid") == c_pid]
            counting = reached
            reached = reached or any(C_ENTRY & {frame.function for frame in view.frames} for view in c_views)
            for view in views:
                pid, count = view.resource.get("process.pid"), view.values[0] if view.values else 1
                functions = {frame.function for frame in view.frames}
                seen["token"] = seen["token"] or any(token in name for name in functions)
                named = seen["named"]
                named["kernel"] = named["kernel"] or any(f.frame_type == "kernel" and f.function for f in view.frames)
                if pid == python_pid:
                    named["python"] = named["python"] or "spin_heavy" in functions
                    named["native"] = named["native"] or any(f.frame_type == "native" and f.function and f.mapping_filename == binary
                                                             for f in view.frames)
                elif pid == spin_pid:
                    seen["spin_samples"] += count
                elif pid == c_pid and counting:
                    seen["c"][0] += count
                    seen["c"][1] += count * bool(view.frames and view.frames[0].function)
                    seen["c"][2] += count * bool(C_ENTRY & functions)
        read = len(complete)
    return seen


@pytest.mark.bpf
def test_without_the_capabilities_to_act_as_each_process_the_collector_refuses_to_start_and_names_them(tmp_path):
    """An agent that could not open a process's files as that process would name nothing of other
    users' processes: rather than run blind, it says which capabilities are missing."""
    caps = ",".join(["-all"] + ["+" + name.removeprefix("CAP_").lower() for name in unit_capabilities()
                                if name not in ("CAP_SETUID", "CAP_SETGID")])
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {"profiling": {"bpf_cache_dir": ""}},
        "exporters": {"debug": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["debug"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }))
    config.chmod(0o644)
    tmp_path.chmod(0o755)
    done = subprocess.run(["setpriv", f"--reuid={DYNAMIC_USER}", f"--regid={DYNAMIC_USER}", "--clear-groups", "--no-new-privs",
                           f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}",
                           str(PYCOLLECTOR), "--config", str(config)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0
    assert "receivers::profiling" in done.stdout + done.stderr and "without CAP_SETUID" in done.stdout + done.stderr \
        and "CAP_SETGID" in done.stdout + done.stderr, done.stdout + done.stderr
