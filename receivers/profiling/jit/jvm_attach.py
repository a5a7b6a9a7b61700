"""HotSpot's attach mechanism, spoken directly: runs a diagnostic command in a JVM as ``jcmd`` does,
without starting a JVM of its own (jcmd costs about half a second of CPU a request).

The protocol (HotSpot on Linux, JDK 8 to 25). A JVM whose attach listener runs accepts connections
on the Unix socket /tmp/.java_pid<pid>. It starts the listener when it gets SIGQUIT and finds a
file .attach_pid<pid> in its working directory or /tmp (without the file, SIGQUIT prints a thread
dump). A request is the protocol version "1", the operation and three arguments, each ended by a
NUL; jcmd's operation is "jcmd", its first argument the command line. The JVM answers with the
operation's result (0: done) in decimal and a newline, then the command's output, and closes.

Who asks: the JVM accepts a peer with its own effective user and group (root too, from JDK 11, but
not a root mapped out of a container's user namespace), and a trigger file owned by its user. So,
as jcmd must, the exchange runs as the JVM's user and group: in a small child process (the
standard library only, about 20 ms of CPU), which also keeps a root collector from creating files
through a path a container controls. Paths are as the JVM sees them: its pid in its own namespace
(the last NSpid) under its root (/proc/PID/root), so a container's JVM is reached from the host.

A JVM run with -Xrs (ReduceSignalUsage) has no SIGQUIT handler, and the signal would end it:
SIGQUIT is sent only to a process whose /proc status shows it caught.

A JVM killed (SIGKILL, the OOM killer) leaves its socket file behind, and a later JVM given the
same pid finds it there with nobody listening: a connection it refuses is such a leftover, and
the listener is started as if there were none (the JVM unlinks the path before it binds its own).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time

PROTOCOL_VERSION = b"1"
LISTENER_POLL_S = 0.02
HELPER_GRACE_S = 5.0  # what the child may take beyond the request's timeout (its start, its exit)
# The child's exit codes besides 0 (its stdout is the command's output, its stderr the reason).
_FAILED, _NO_LISTENER = 2, 3


class AttachError(Exception):
    """The command did not run: why, in words for a log line."""


class _NobodyListens(AttachError):
    """No socket at the path, or one no process listens on (a killed JVM's)."""


class NoListener(AttachError):
    """The JVM's attach listener cannot be started (-Xrs, -XX:+DisableAttachMechanism, or not yet
    in a JVM still starting): each SIGQUIT to such a JVM prints a thread dump on its output."""


def run_jcmd(pid: int, command: str, timeout_s: float = 10.0) -> str:
    """Run ``command`` (e.g. "Compiler.perfmap") in JVM ``pid``, as its user; its output."""
    try:
        status = _status(pid)
        uid, gid = int(status["Uid"].split()[1]), int(status["Gid"].split()[1])  # effective ids
    except (KeyError, ValueError, IndexError) as error:
        raise AttachError(f"process {pid}: unreadable status ({error!r})") from error
    same_user = (uid, gid) == (os.geteuid(), os.getegid())
    try:
        # The interpreter itself, not a virtualenv's link to it, from /: the JVM's user may not
        # be able to reach the collector's directories.
        done = subprocess.run([os.path.realpath(sys.executable), "-I", "-S", "-c", _CHILD, str(pid), command, str(timeout_s)],
                              capture_output=True, timeout=timeout_s + HELPER_GRACE_S, close_fds=True, cwd="/",
                              **({} if same_user else {"user": uid, "group": gid, "extra_groups": []}))
    except (OSError, subprocess.SubprocessError) as error:  # no right to switch users, timed out
        raise AttachError(f"could not ask as the JVM's user {uid}: {error}") from error
    reason = done.stderr.decode("utf-8", "replace").strip()[-300:]
    if done.returncode == _NO_LISTENER:
        raise NoListener(reason)
    if done.returncode != 0:
        raise AttachError(reason or f"the attach helper exited with {done.returncode}")
    return done.stdout.decode("utf-8", "replace").strip()


def exchange(pid: int, command: str, timeout_s: float) -> str:
    """The child's work, as the JVM's user: start the listener if need be, send, read the reply."""
    deadline = time.monotonic() + timeout_s
    status = _status(pid)
    namespace_pid = int(status["NSpid"].split()[-1])
    root = f"/proc/{pid}/root"
    socket_path = f"{root}/tmp/.java_pid{namespace_pid}"
    request = b"\0".join([PROTOCOL_VERSION, b"jcmd", command.encode(), b"", b""]) + b"\0"
    left = _socket_inode(socket_path)
    try:
        if left is None:
            raise _NobodyListens(socket_path)
        reply = _send(socket_path, request, deadline)
    except _NobodyListens:
        _start_listener(pid, status, f"{root}/tmp/.attach_pid{namespace_pid}", socket_path, left, deadline)
        reply = _send(socket_path, request, deadline)
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


def _socket_inode(path: str) -> int | None:
    """The inode of the socket at ``path``; None if there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino if stat.S_ISSOCK(found.st_mode) else None


def _start_listener(pid: int, status: dict[str, str], trigger: str, socket_path: str, left: int | None, deadline: float) -> None:
    """Have the JVM open its socket at ``socket_path``: a socket other than ``left`` (the inode of
    one a killed JVM left there, or None)."""
    if not int(status.get("SigCgt", "0"), 16) >> (signal.SIGQUIT - 1) & 1:
        raise NoListener("the JVM does not catch SIGQUIT (run with -Xrs, or still starting): "
                         "the signal that starts its attach listener would end it")
    try:  # a new file of ours, not something a link there points at
        os.close(os.open(trigger, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        pass  # another client's, which asks the same
    except OSError as error:
        raise AttachError(f"cannot create the attach trigger {trigger}: {error}") from error
    try:
        os.kill(pid, signal.SIGQUIT)
        while _socket_inode(socket_path) in (None, left):
            if time.monotonic() >= deadline:
                raise NoListener(f"the JVM did not open {socket_path} after SIGQUIT (-XX:+DisableAttachMechanism?)")
            time.sleep(LISTENER_POLL_S)
    except OSError as error:
        raise AttachError(f"cannot signal process {pid}: {error}") from error
    finally:
        try:
            os.unlink(trigger)
        except OSError:
            pass


def _send(socket_path: str, request: bytes, deadline: float) -> bytes:
    chunks = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(max(0.1, deadline - time.monotonic()))
            connection.connect(socket_path)
            connection.sendall(request)
            while chunk := connection.recv(65536):
                chunks.append(chunk)
                connection.settimeout(max(0.1, deadline - time.monotonic()))
    except ConnectionRefusedError as error:  # (at connect: no process listens on the path)
        raise _NobodyListens(f"{socket_path}: {error}") from error
    except OSError as error:  # refused by the peer check (it closes), timed out, reset
        raise AttachError(f"{socket_path}: {error}") from error
    return b"".join(chunks)


def _main(argv: list[str]) -> int:
    try:
        sys.stdout.write(exchange(int(argv[0]), argv[1], float(argv[2])))
    except NoListener as error:
        sys.stderr.write(str(error))
        return _NO_LISTENER
    except Exception as error:  # noqa: BLE001 - the parent logs it
        sys.stderr.write(str(error) if isinstance(error, AttachError) else repr(error))
        return _FAILED
    return 0


if __name__ == "__main__":  # the child: ``python -I -S -c <this source> PID COMMAND TIMEOUT``
    raise SystemExit(_main(sys.argv[1:]))
# The child runs this module's source with only the standard library (-I -S: no site-packages, no
# environment), so it needs neither the collector's files nor its virtualenv to be readable.
with open(__file__, encoding="utf-8") as _source:
    _CHILD = _source.read()
