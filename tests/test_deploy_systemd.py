"""deploy/systemd/pycollector.service: systemd accepts it, rates its hardening, and the
capabilities it grants are enough to profile, shown by running the collector the way the unit
would: as an unprivileged user holding exactly those capabilities (no systemd runs as PID 1 here,
so the unit itself cannot be started)."""

from __future__ import annotations

import configparser
import os
import resource
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

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "deploy" / "systemd" / "pycollector.service"
CONFIG = REPO / "deploy" / "systemd" / "config.yaml"
SYSTEM_UNITS = next((path for path in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if path.is_dir()), None)
PYCOLLECTOR = Path(sys.executable).parent / "pycollector"
NOBODY = 65534

needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None or SYSTEM_UNITS is None,
                                           reason="systemd-analyze is missing (Debian package systemd; scripts/setup.sh installs it)")


def service_section() -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return dict(parser["Service"])


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


@pytest.mark.bpf
def test_the_units_capabilities_are_enough_to_profile_another_users_processes(tmp_path):
    """The collector runs as nobody with the unit's capabilities (ambient, as DynamicUser= and
    AmbientCapabilities= give them), its LimitMEMLOCK and NoNewPrivileges; the workload runs as
    root in a mount namespace of its own, from a binary deleted once started (as after a package
    upgrade). Its Python frames need CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (/proc/PID/mem), its
    native frames CAP_CHECKPOINT_RESTORE (/proc/PID/map_files: the only way left to the file),
    kernel frames' names CAP_SYSLOG (/proc/kallsyms), the rest CAP_BPF and CAP_PERFMON."""
    service = service_section()
    caps = ",".join("+" + name.removeprefix("CAP_").lower() for name in service["AmbientCapabilities"].split())
    # LimitMEMLOCK=infinity, as far as this machine lets the test raise it (a sandbox may not grant
    # CAP_SYS_RESOURCE: then the hard limit it has, 8 MiB here, which is enough on two CPUs).
    assert service["LimitMEMLOCK"] == "infinity"
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    memlock = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert service["NoNewPrivileges"] == "yes"

    work = Path(tempfile.mkdtemp(prefix="pycollector-unit-"))  # not under pytest's 0700 folders
    os.chown(work, NOBODY, NOBODY)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {"profiling": {"reporter_interval": "1s", "unwind_cache_dir": str(work / "cache")}},
        "exporters": {"file": {"path": str(work / "profiles.jsonl"), "flush_interval": "200ms"}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["file"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }))
    (tmp_path / "workload.py").write_text(WORKLOAD)
    python = Path(os.path.realpath("/usr/bin/python3"))
    workload = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec",
                                 'mount -t tmpfs tmpfs /mnt; cp "$0" /mnt/; cp "$1" /mnt/workload.py; exec "/mnt/${0##*/}" /mnt/workload.py',
                                 str(python), str(tmp_path / "workload.py")])
    log = (tmp_path / "collector.log").open("w")
    collector = None
    try:
        binary = f"/mnt/{python.name}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _exe_is(workload.pid, binary):
            time.sleep(0.05)
        assert _exe_is(workload.pid, binary)
        time.sleep(0.3)  # the script is read and running
        os.unlink(f"/proc/{workload.pid}/root{binary}")
        collector = subprocess.Popen(
            ["prlimit", f"--memlock={memlock}:{memlock}", "--",
             "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs",
             f"--inh-caps=-all,{caps}", f"--ambient-caps=-all,{caps}", f"--bounding-set=-all,{caps}",
             str(PYCOLLECTOR), "--config", str(config)],
            cwd=work, stdout=log, stderr=subprocess.STDOUT)
        named = _wait_for_names(work / "profiles.jsonl", workload.pid, binary, collector, tmp_path / "collector.log", timeout=40)
        collector.send_signal(signal.SIGINT)
        assert collector.wait(timeout=20) == 0, (tmp_path / "collector.log").read_text()
    finally:
        workload.kill()
        workload.wait()
        if collector is not None and collector.poll() is None:
            collector.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    output = (tmp_path / "collector.log").read_text()
    assert "Permission denied" not in output and "needs root or the capabilities" not in output, output
    assert named == {"python": True, "native": True, "kernel": True}, output


def _exe_is(pid: int, path: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe").startswith(path)
    except OSError:
        return False


def _wait_for_names(path: Path, pid: int, binary: str, collector, log: Path, timeout: float) -> dict[str, bool]:
    """Whether the workload's Python frames (spin_heavy), its native frames in the deleted binary
    and anyone's kernel frames came out named, once all have or the time is up."""
    named = {"python": False, "native": False, "kernel": False}
    read = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(named.values()):
        assert collector.poll() is None, log.read_text()
        time.sleep(0.5)
        if not path.exists():
            continue
        text = path.read_bytes()
        complete = text[:text.rfind(b"\n") + 1].splitlines()  # a line being written is left for later
        for line in complete[read:]:
            for view in iter_samples(from_json(line, ProfilesData)):
                for frame in view.frames:
                    if frame.frame_type == "kernel" and frame.function:
                        named["kernel"] = True
                    if view.resource.get("process.pid") != pid:
                        continue
                    if frame.function == "spin_heavy":
                        named["python"] = True
                    if frame.frame_type == "native" and frame.function and frame.mapping_filename == binary:
                        named["native"] = True
        read = len(complete)
    return named

