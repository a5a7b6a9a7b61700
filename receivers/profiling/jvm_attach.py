"""HotSpot's attach mechanism, spoken directly: runs a diagnostic command in a JVM as ``jcmd`` does,
without starting a JVM of its own (jcmd costs about half a second of CPU a request).

The protocol (HotSpot on Linux, JDK 8 to 25). A JVM whose attach listener runs accepts connections
on the Unix socket /tmp/.java_pid<pid>. It starts the listener when it gets SIGQUIT and finds a
file .attach_pid<pid> in its working directory or /tmp (without the file, SIGQUIT prints a thread
dump). A request is the protocol version "1", the operation and three arguments, each ended by a
NUL; jcmd's operation is "jcmd", its first argument the command line. The JVM answers with the
operation's result (0: done) in decimal and a newline, then the command's output, and closes.

Paths are as the JVM sees them: its pid in its own namespace (the last NSpid) under its root
(/proc/PID/root), so a container's JVM is reached from the host. The JVM accepts a peer and a
trigger file of its own effective user, or root's (JDK 8 only its own user's: the trigger file
is given the JVM's user).

A JVM run with -Xrs (ReduceSignalUsage) has no SIGQUIT handler, and the signal would end it:
SIGQUIT is sent only to a process whose /proc status shows it caught.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import time

PROTOCOL_VERSION = b"1"
LISTENER_POLL_S = 0.02


class AttachError(Exception):
    """The command did not run: why, in words for a log line."""


class NoListener(AttachError):
    """The JVM's attach listener cannot be started (-Xrs, -XX:+DisableAttachMechanism): asking
    again would not help, and each SIGQUIT to such a JVM prints a thread dump on its output."""


def run_jcmd(pid: int, command: str, timeout_s: float = 10.0) -> str:
    """Run ``command`` (e.g. "Compiler.perfmap") in JVM ``pid``; its output."""
    deadline = time.monotonic() + timeout_s
    status = _status(pid)
    namespace_pid = int(status["NSpid"].split()[-1])
    root = f"/proc/{pid}/root"
    socket_path = f"{root}/tmp/.java_pid{namespace_pid}"
    if not _is_socket(socket_path):
        _start_listener(pid, status, f"{root}/tmp/.attach_pid{namespace_pid}", socket_path, deadline)
    reply = _exchange(socket_path, b"\0".join([PROTOCOL_VERSION, b"jcmd", command.encode(), b"", b""]) + b"\0", deadline)
    result, _, output = reply.partition(b"\n")
    text = output.decode("utf-8", "replace").strip()
    if result.strip() != b"0":
        raise AttachError(f"the JVM answered {result.decode('ascii', 'replace').strip() or 'nothing'}: {text[-300:]}")
    return text


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as stream:
            return dict(line.rstrip("\n").split(":\t", 1) for line in stream if ":\t" in line)
    except OSError as error:
        raise AttachError(f"no process {pid}: {error}") from error


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _start_listener(pid: int, status: dict[str, str], trigger: str, socket_path: str, deadline: float) -> None:
    if not int(status.get("SigCgt", "0"), 16) >> (signal.SIGQUIT - 1) & 1:
        raise NoListener("the JVM does not catch SIGQUIT (run with -Xrs?): the signal that starts its attach listener would end it")
    uid, gid = int(status["Uid"].split()[1]), int(status["Gid"].split()[1])  # effective ids
    try:
        descriptor = os.open(trigger, os.O_WRONLY | os.O_CREAT, 0o600)
        os.fchown(descriptor, uid, gid)
        os.close(descriptor)
    except OSError as error:
        raise AttachError(f"cannot create the attach trigger {trigger}: {error}") from error
    try:
        os.kill(pid, signal.SIGQUIT)
        while not _is_socket(socket_path):
            if time.monotonic() >= deadline:
                raise NoListener(f"the JVM did not open {socket_path} after SIGQUIT (-XX:+DisableAttachMechanism?)")
            time.sleep(LISTENER_POLL_S)
    except ProcessLookupError as error:
        raise AttachError(f"process {pid} exited") from error
    finally:
        try:
            os.unlink(trigger)
        except OSError:
            pass


def _exchange(socket_path: str, request: bytes, deadline: float) -> bytes:
    chunks = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(max(0.1, deadline - time.monotonic()))
            connection.connect(socket_path)
            connection.sendall(request)
            while chunk := connection.recv(65536):
                chunks.append(chunk)
                connection.settimeout(max(0.1, deadline - time.monotonic()))
    except OSError as error:  # refused (another user's JVM), timed out, reset
        raise AttachError(f"{socket_path}: {error}") from error
    return b"".join(chunks)
