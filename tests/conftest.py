"""Shared fixtures. eBPF tests run for real; they skip only when BPF cannot work here and the
environment does not demand it (CI sets PYCOLLECTOR_REQUIRE_BPF=1, and then they fail instead)."""

from __future__ import annotations

import collections
import fcntl
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from pycollector import logs

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO.parent / "shared" / "workloads"

logs.configure("console", "warn")


@functools.lru_cache(maxsize=None)
def bpf_unavailable_reason() -> str | None:
    """Why BPF programs cannot be loaded here, or None when they can."""
    if os.geteuid() != 0:
        return "not running as root (the profiling receiver needs CAP_BPF and CAP_PERFMON)"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "the bcc module is missing (Debian package python3-bpfcc)"
    if not Path(f"/lib/modules/{os.uname().release}/build/include").exists():
        return "kernel headers are missing (run scripts/setup.sh)"
    return None


def build_go_program(source: Path, output: Path, *flags: str) -> Path:
    """``go build`` of one file into ``output``, with its build cache beside it: no module, no
    network. Returns ``output``."""
    env = {**os.environ, "GOCACHE": str(output.parent / "gocache"), "GO111MODULE": "off", "GOPROXY": "off"}
    subprocess.run(["go", "build", *flags, "-o", str(output), str(source)], check=True, capture_output=True, env=env,
                   cwd=output.parent, timeout=300)
    return output


def share_tolerance(samples: float, share: float = 0.75, floor: float = 0.05) -> float:
    """How far a sampled share may stray from the true ``share``: four standard deviations of a
    binomial proportion over ``samples`` samples, and never less than ``floor``. A busy CI host
    gives a workload little CPU time, and with 120 samples one standard deviation is 4 points.
    Four, not three: the suite compares some 30 shares a run, and at three sigmas one of them
    failed now and then by chance alone (ci5 of session 28: C's 0.778 against perf's 0.727 over
    1,277 and 1,304 samples, 3.0 sigmas, each within 2.3 of the true 0.75)."""
    return max(floor, 4 * (share * (1 - share) / max(samples, 1.0)) ** 0.5)


def stolen_seconds() -> float:
    """CPU time the hypervisor took from this machine's CPUs since boot (/proc/stat's steal
    column, summed over CPUs).  Steal moves a sample count away from hz x CPU seconds either way,
    by at most hz x the time stolen meanwhile: a cpu-clock timer that comes due while its vCPU is
    stolen fires once when the vCPU is back, however many periods went by (fewer samples, if the
    guest still charges that time to the task it interrupted); and a guest that accounts steal
    (CONFIG_PARAVIRT_TIME_ACCOUNTING, Debian's kernels) leaves the stolen time out of the task's
    CPU time, while a timer delayed by a steal shorter than its period still fires, in that task
    (more samples than its rusage gives: 515 where 440 were due, project CI, beside a futex storm
    on a loaded host)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()  # cpu user nice system idle iowait irq softirq steal ...
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def samples_match_cpu_time(samples: float, hz: float, cpu_s: float, stolen_s: float = 0.0) -> bool:
    """Whether `samples` is what a process that spent `cpu_s` seconds on the CPU should get at
    `hz`: within three Poisson sigmas (and 5%), and what `stolen_s` moved it either way (see
    stolen_seconds)."""
    expected = hz * cpu_s
    slack = max(0.05 * expected, 3 * expected ** 0.5) + 3 + hz * stolen_s
    return expected - slack <= samples <= expected + slack


PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))) / "versions"
# The CPythons sdk/python supports (its setup.py: 3.8 and later): Debian's, and pyenv's.
SDK_PYTHON_VERSIONS = ("debian", *(f"3.{minor}" for minor in range(8, 14)))


NOBODY = 65534


@pytest.fixture
def workdir():
    """A directory user nobody may read and write, for workloads run as nobody (pytest's own are
    root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="pycollector-nobody-", dir="/var/tmp"))
    path.chmod(0o755)
    os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_for(condition, timeout: float = 20.0) -> bool:
    """Whether ``condition()`` came true within ``timeout`` seconds (looked at every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def rows_loaded(service, pid: int, files: tuple[str, ...], timeout: float = 60) -> list[str]:
    """Wait until the unwind rows of the files of process ``pid`` named ``files`` are in the kernel
    (a loaded host builds them later than a workload's first second, and a wait's stack then ends
    in libc); those still waiting at ``timeout``."""
    from pycollector.testing import receiver_of

    receiver = receiver_of(service)
    deadline = time.monotonic() + timeout
    while True:
        info = receiver.processes.lookup(pid)
        mappings = [mapping for mapping in (info.mappings if info else []) if mapping.file_backed and mapping.path.rsplit("/", 1)[-1] in files]
        waiting = [mapping.path for mapping in mappings if receiver.unwind.file_state(mapping.identity) != "loaded"]
        if info is None or len({mapping.path.rsplit("/", 1)[-1] for mapping in mappings}) < len(files):
            waiting = [f"{pid}'s {', '.join(files)}"]
        if not waiting or time.monotonic() > deadline:
            return waiting
        time.sleep(0.2)


def pyenv_python(version: str) -> Path | None:
    """pyenv's newest CPython ``version`` (e.g. "3.8") on this host, or None."""
    found = sorted(PYENV_VERSIONS.glob(f"{version}.*"))
    python = found[-1] / "bin" / f"python{version}" if found else None
    return python if python is not None and python.exists() else None


@pytest.fixture(scope="session")
def sdk_pythons(tmp_path_factory):
    """Per CPython ("debian", or a pyenv version such as "3.8"): a virtual environment's python with
    sdk/python installed as pip installs it (its .pth files run by site) and, for pyenv's, the
    OpenTelemetry SDK release pip picks for it beside it. Built once for the session: the context
    writer's tests and the heap sampler's share them (each build compiles both extensions)."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.heap_samplers import DEBIAN_PYTHON, install_python_sampler

    # Under xdist (make test: the tests without BPF on three workers) the workers share the builds:
    # the first to ask for a version builds it under a lock in their common directory, the other
    # waits for it, rather than both compiling all of them.
    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else tmp_path_factory.getbasetemp()

    def build(version: str) -> Path | None:
        python = DEBIAN_PYTHON if version == "debian" else pyenv_python(version)
        if python is None:
            return None
        packages = () if version == "debian" else ("opentelemetry-sdk",)
        directory = shared / f"sdk-python-{version}"
        with open(shared / f"sdk-python-{version}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            built = directory / "built"
            if built.exists():
                return Path(built.read_text())
            if directory.exists():  # (a build that failed before)
                shutil.rmtree(directory)
            directory.mkdir()
            target = install_python_sampler(str(python), directory, packages)
            built.write_text(str(target))
            return target

    # The first request starts every build, two at a time (a build is a compiler's and pip's work,
    # ~15 s of one core), so the later versions are ready when their tests come.
    builds: dict = {}
    with ThreadPoolExecutor(max_workers=2) as pool:

        def get(version: str = "debian") -> Path:
            if not builds:
                for known in SDK_PYTHON_VERSIONS:
                    builds[known] = pool.submit(build, known)
            if version not in builds:
                builds[version] = pool.submit(build, version)
            built = builds[version].result()
            if built is None:
                pytest.skip(f"pyenv has no CPython {version} here")
            return built

        yield get
        for future in builds.values():
            future.cancel()


def pytest_runtest_setup(item):
    if item.get_closest_marker("bpf") is None:
        return
    reason = bpf_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("PYCOLLECTOR_REQUIRE_BPF") == "1":
        pytest.fail(f"eBPF is required (PYCOLLECTOR_REQUIRE_BPF=1) but unavailable: {reason}")
    pytest.skip(f"eBPF unavailable: {reason}")


def run_cli(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run the installed ``pycollector`` console script, as a user would."""
    executable = shutil.which("pycollector", path=str(Path(sys.executable).parent)) or "pycollector"
    return subprocess.run([executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, **kwargs)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def log_output():
    """Logs at info level into a buffer for the duration of a test (read with .getvalue())."""
    import io

    buffer = io.StringIO()
    logs.configure("console", "info", stream=buffer)
    yield buffer
    logs.configure("console", "warn")


def perf_leaves(data: Path) -> collections.Counter:
    """Samples by leaf function, as perf's own DWARF unwinding and symbolization saw them."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"], capture_output=True, text=True, check=True).stdout
    leaves: collections.Counter = collections.Counter()
    for block in script.strip().split("\n\n"):
        lines = block.strip().splitlines()
        if lines:
            leaves[lines[0].split(None, 1)[-1]] += 1
    return leaves


PYCOLLECTOR = shutil.which("pycollector", path=str(Path(sys.executable).parent))
STARTUP_TIMEOUT = 20.0


class Collector:
    """A pycollector process run from a config written to ``folder``; stop() sends Ctrl-C."""

    def __init__(self, folder: Path, name: str, config: dict, env: dict[str, str] | None = None):
        self.config_path = folder / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = folder / f"{name}.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen([PYCOLLECTOR, "--config", str(self.config_path)], stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})})

    def wait_listening(self, port: int) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"pycollector exited early:\n{self.log()}"
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.05)
        raise AssertionError(f"pycollector did not listen on {port}:\n{self.log()}")

    def stop(self) -> tuple[int, float]:
        """Ctrl-C; (exit code, seconds it took to exit)."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=15)
        return code, time.monotonic() - began

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture
def collectors(tmp_path):
    started: list[Collector] = []

    def start(name: str, config: dict, env: dict[str, str] | None = None) -> Collector:
        collector = Collector(tmp_path, name, config, env)
        started.append(collector)
        return collector

    yield start
    for collector in started:
        collector.kill()


@pytest.fixture(params=["C extension", "pure Python"])
def profiles_codec(request, monkeypatch):
    """Run a test twice: with the C extension over serialized profiles, and with the pure-Python
    fallback a pycollector installed without a compiler runs (pycollector.pdata.serialized)."""
    from pycollector.pdata import serialized

    if request.param == "C extension":
        if serialized._native is None:
            pytest.fail("pycollector.pdata.serialized._native is not built: pip install -e . builds it")
        monkeypatch.setattr(serialized, "native", serialized._native)
    else:
        monkeypatch.setattr(serialized, "native", None)
    return request.param


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def spawn_with_pid(pid: int, argv: list[str]) -> subprocess.Popen:
    """A process that has ``pid``: the next fork after ns_last_pid = pid - 1 takes it, unless
    another process of the host forked in between; then try again."""
    if os.geteuid() != 0:
        pytest.skip("choosing a pid (ns_last_pid) needs root")
    # Start times count clock ticks (10 ms): a successor started in the same tick would look like
    # the same incarnation. On a real host the pid space wraps far slower than that.
    time.sleep(0.05)
    for _ in range(20):
        with open(NS_LAST_PID, "w") as last:
            last.write(str(pid - 1))
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        if child.pid == pid:
            loaded(child.pid)
            return child
        child.kill()
        child.wait()
    pytest.skip(f"could not get pid {pid} again: the host forks too often")


def loaded(pid: int, last: str = "libc.so") -> None:
    """Wait until the program has ``last`` mapped (libc: its libraries; a static program: its own
    path). Popen returns once exec began, before the kernel and ld.so have mapped anything: the
    kernel closes the exec's close-on-exec pipe before it maps the program (nine times in ten a
    read of /proc/PID/maps right after Popen shows only the stack, here)."""
    deadline = time.monotonic() + 10
    while last not in open(f"/proc/{pid}/maps").read():
        assert time.monotonic() < deadline, f"pid {pid} never mapped {last}"
        time.sleep(0.01)


def capturing_service(tmp_path: Path, hz: int, reporter_interval: str = "1s", **settings):
    """(a Service, not started, whose profiling receiver samples at ``hz`` (its other keys
    ``settings``) and exports to a capturing exporter; that exporter's factory, whose consumer
    holds what it exported)."""
    from pycollector.config.validate import build_plan
    from pycollector.service import Service
    from pycollector.testing import CapturingExporterFactory, registry_with

    capture = CapturingExporterFactory()
    config = {
        "receivers": {"profiling": {"samples_per_second": hz, "reporter_interval": reporter_interval, "unwind_cache_dir": str(tmp_path / "cache"),
                                    **settings}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    return Service(build_plan(config, registry_with(exporters={"capture": capture}))), capture


def profile_a_run(tmp_path: Path, argv: list, hz: int, runtime: str, timeout: float = 90) -> dict:
    """``argv`` run to its end with a profiling receiver on (``hz``, a report a second) and no perf
    map asked for: {"pid", "messages" (what it exported), "stats" (the ``runtime`` room's:
    "v8", "hotspot"), "cpu_s" (the CPU time the kernel counted for it), "stolen_s" (see
    stolen_seconds)}."""
    from pycollector.testing import receiver_of

    service, capture = capturing_service(tmp_path, hz)
    service.start()
    try:
        started, stolen_before = time.time(), stolen_seconds()
        process = subprocess.Popen([str(part) for part in argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        try:
            cpu_s = cpu_seconds_at_exit(process, timeout)
        finally:
            process.kill()
        stolen_s = stolen_seconds() - stolen_before
        time.sleep(0.3)  # (its last samples in the kernel's maps: shutdown reports the last interval)
    finally:
        service.shutdown()
    stats = dict(getattr(receiver_of(service), runtime).stats)
    # (one left by an earlier process with the same pid is older than this run)
    perf_map = Path(f"/tmp/perf-{process.pid}.map")
    assert not (perf_map.exists() and perf_map.stat().st_mtime >= started), "no perf map: the names come from the runtime's memory"
    return {"pid": process.pid, "messages": capture.consumer.messages, "stats": stats, "cpu_s": cpu_s, "stolen_s": stolen_s}


def cpu_seconds_at_exit(process: subprocess.Popen, timeout: float) -> float:
    """Waits for ``process`` to end (TimeoutExpired after ``timeout`` seconds): the user and system
    CPU time the kernel counted for it, all its threads."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(process.args, timeout)
        time.sleep(0.02)


def samples_of(profiled: dict, after_reports: int = 0):
    """(sample, its value) for each sample with frames of the process ``profile_a_run`` ran;
    those of its first ``after_reports`` reports left out."""
    from pycollector.pdata import iter_samples

    reports = 0
    for message in profiled["messages"]:
        views = [view for view in iter_samples(message) if view.resource.get("process.pid") == profiled["pid"] and view.frames]
        reports += bool(views)
        if reports > after_reports:
            for view in views:
                yield view, sum(view.values)
