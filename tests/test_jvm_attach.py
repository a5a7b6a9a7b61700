"""HotSpot's attach protocol spoken by receivers/profiling/jit/jvm_attach.py, against real JVMs (JDK 17):
what jcmd does, what it must refuse, and the perf map requester that uses it."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import structlog

from receivers.profiling.jit import jvm_perfmap
from receivers.profiling.jit.jvm_attach import AttachError, NoListener, run_jcmd
from receivers.profiling.jit.jvm_perfmap import JvmPerfMapRequester
from receivers.profiling.processes.table import ProcessTable
from tests.conftest import WORKLOADS

pytestmark = pytest.mark.skipif(not shutil.which("javac"), reason="no JDK")


@pytest.fixture(scope="module")
def classes(tmp_path_factory) -> Path:
    built = tmp_path_factory.mktemp("java")
    subprocess.run(["javac", "-d", str(built), str(WORKLOADS / "KnownSplit.java")], check=True)
    return built


@pytest.fixture
def shared_classes(classes) -> Path:
    """The classes where another user can read them (pytest's directories are root's alone)."""
    shared = Path(tempfile.mkdtemp(prefix="pycollector-java-"))
    shared.chmod(0o755)
    for built in classes.iterdir():
        shutil.copy(built, shared / built.name)
        (shared / built.name).chmod(0o644)
    yield shared
    shutil.rmtree(shared)


def start_jvm(classes: Path, *options: str, user: str | None = None) -> subprocess.Popen:
    """A JVM running KnownSplit for a minute, 1.5 s in (its handlers installed, spinHeavy
    compiled); its output (a thread dump, if SIGQUIT reaches it without a listener) is kept."""
    jvm = subprocess.Popen(["java", *options, "-cp", str(classes), "KnownSplit", "60"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           **({"user": user, "group": pwd.getpwnam(user).pw_gid, "cwd": "/"} if user else {}))
    time.sleep(1.5)
    return jvm


def stop(jvm: subprocess.Popen) -> bytes:
    jvm.kill()
    output, _ = jvm.communicate(timeout=20)
    for leftover in (f"/tmp/perf-{jvm.pid}.map", f"/tmp/.java_pid{jvm.pid}"):
        Path(leftover).unlink(missing_ok=True)
    return output


def leave_a_dead_socket(pid: int) -> int:
    """A socket file at the path of JVM ``pid``'s, with nobody listening on it, as a JVM killed
    under that pid before leaves it: its inode."""
    path = f"/tmp/.java_pid{pid}"
    Path(path).unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(path)
    return os.stat(path).st_ino


def listening(pid: int) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(f"/tmp/.java_pid{pid}") == 0


def test_a_command_runs_as_jcmd_runs_it(classes):
    jvm = start_jvm(classes)
    try:
        assert not listening(jvm.pid), "no listener before the first request"
        started = time.monotonic()
        version = run_jcmd(jvm.pid, "VM.version")
        took = time.monotonic() - started
        jcmd = subprocess.run(["jcmd", str(jvm.pid), "VM.version"], capture_output=True, text=True, timeout=30) if shutil.which("jcmd") else None
        print(f"VM.version through the socket in {took * 1000:.0f} ms: {version.splitlines()[0]}")
        assert "OpenJDK" in version or "HotSpot" in version
        if jcmd is not None:
            assert version.splitlines()[-1] in jcmd.stdout, "jcmd prints the same"
        assert not os.path.exists(f"/tmp/.attach_pid{jvm.pid}"), "the trigger file is removed"
        with pytest.raises(AttachError, match="Unknown diagnostic command"):
            run_jcmd(jvm.pid, "No.such.command")
        assert jvm.poll() is None
    finally:
        output = stop(jvm)
    assert b"Full thread dump" not in output, "the signal started the listener, not a thread dump"


def test_a_socket_a_killed_jvm_left_under_the_same_pid_is_replaced_by_the_listener(classes):
    """A JVM killed leaves /tmp/.java_pid<pid>; a JVM given that pid later has no listener on
    it (ci25: the connection refused, the request failed): the listener is started all the same,
    and the request answered on the socket the JVM put in its place."""
    jvm = start_jvm(classes)
    try:
        dead = leave_a_dead_socket(jvm.pid)
        version = run_jcmd(jvm.pid, "VM.version")
        assert "OpenJDK" in version or "HotSpot" in version
        assert os.stat(f"/tmp/.java_pid{jvm.pid}").st_ino != dead and listening(jvm.pid)
    finally:
        output = stop(jvm)
    assert b"Full thread dump" not in output, "the signal started the listener, not a thread dump"


@pytest.mark.parametrize("left", ["no socket", "a killed JVM's socket"])
def test_a_jvm_without_a_sigquit_handler_is_not_signalled(classes, left):
    """-Xrs leaves SIGQUIT to its default action, which would end the JVM."""
    jvm = start_jvm(classes, "-Xrs", "-XX:+DisableAttachMechanism")
    try:
        if left != "no socket":
            leave_a_dead_socket(jvm.pid)
        with pytest.raises(NoListener, match="does not catch SIGQUIT"):
            run_jcmd(jvm.pid, "Compiler.perfmap")
        time.sleep(0.2)
        assert jvm.poll() is None, "still running"
    finally:
        stop(jvm)


def test_the_requester_stops_asking_a_jvm_whose_listener_never_starts(classes, monkeypatch):
    """Once the JVM has run long enough to have its handlers (SETTLED_AFTER_S); before, it is
    asked again."""
    monkeypatch.setattr(jvm_perfmap, "REQUEST_TIMEOUT_S", 2.0)  # how long it waits for the socket
    jvm = start_jvm(classes, "-XX:+DisableAttachMechanism")
    try:
        processes = ProcessTable()
        processes.on_new_process(jvm.pid, jvm.pid, "java")
        requester = JvmPerfMapRequester(processes, 3600, structlog.get_logger())
        requester._request_all()
        requester._request_all()
        assert requester.stats == {"requests": 2, "failures": 2}, "a young JVM is asked again"
        monkeypatch.setattr(jvm_perfmap, "SETTLED_AFTER_S", 1.0)
        requester._request_all()
        requester._request_all()
        assert requester.stats["requests"] == 3, "a settled one is not"
        assert jvm.poll() is None
    finally:
        output = stop(jvm)
    assert output.count(b"Full thread dump") == 3, "one thread dump per SIGQUIT"


def test_the_requester_gets_a_perf_map_written(classes):
    jvm = start_jvm(classes)
    try:
        processes = ProcessTable()
        processes.on_new_process(jvm.pid, jvm.pid, "java")
        requester = JvmPerfMapRequester(processes, 3600, structlog.get_logger())
        requester._request_all()
        assert requester.stats == {"requests": 1, "failures": 0}
        names = Path(f"/proc/{jvm.pid}/root/tmp/perf-{jvm.pid}.map").read_text()
        assert "KnownSplit.spinHeavy" in names
    finally:
        stop(jvm)


def test_a_jvm_of_another_user_is_asked_as_that_user(shared_classes):
    """The JVM accepts only its own user (or root, outside user namespaces): the request runs as
    the JVM's user, and the trigger file is that user's."""
    jvm = start_jvm(shared_classes, user="nobody")
    try:
        started = time.monotonic()
        version = run_jcmd(jvm.pid, "VM.version")
        took = time.monotonic() - started
        print(f"a JVM of user nobody answered in {took * 1000:.0f} ms")
        assert "OpenJDK" in version or "HotSpot" in version
        listener = Path(f"/tmp/.java_pid{jvm.pid}")
        assert listener.stat().st_uid == pwd.getpwnam("nobody").pw_uid
        run_jcmd(jvm.pid, "Compiler.perfmap")
        assert Path(f"/tmp/perf-{jvm.pid}.map").stat().st_uid == pwd.getpwnam("nobody").pw_uid
    finally:
        stop(jvm)
