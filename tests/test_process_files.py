"""The hardened open (processes/files.py) lets the kernel judge, as the sampled process.

A user's process names paths; the root agent opens them only where that user could. Mode bits
alone say yes to each of the files below, and the user still cannot read them: an ACL says no,
or a directory on the way is closed to it. Each is tried with a real process of user nobody.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import sys
import threading
from pathlib import Path

import pytest

from receivers.profiling.processes import files
from receivers.profiling.processes.credentials import acting_as
from receivers.profiling.processes.proc import Credentials
from receivers.profiling.processes.table import ProcessTable

from tests.deployments import DEPLOYMENTS, REPO, run_as_deployed

NOBODY = 65534
ACL_USER, ACL_READ = 0x02, 0x04
ACL_ENTRIES = {"user_obj": 0x01, "group_obj": 0x04, "mask": 0x10, "other": 0x20}

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")


@pytest.fixture()
def place():
    # Not under pytest's temporary directory: only root may search that one.
    root = Path(tempfile.mkdtemp(prefix="pycollector-files-", dir="/var/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def nobody_process():
    process = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "60"])
    try:
        info = None
        for _ in range(100):  # until setpriv has become sleep, with nobody's credentials (a snapshot
            info = ProcessTable().snapshot(process.pid)  # reads its files one by one: both must show)
            if info.executable_name == "sleep" and info.credentials is not None and info.credentials.fsuid == NOBODY:
                break
            threading.Event().wait(0.02)
        yield info
    finally:
        process.kill()
        process.wait()


def deny_acl(path: Path, uid: int) -> None:
    """A POSIX access ACL that keeps mode 0644's rights but gives user ``uid`` none."""
    entries = [(ACL_ENTRIES["user_obj"], 6, 0xFFFFFFFF), (ACL_USER, 0, uid), (ACL_ENTRIES["group_obj"], 4, 0xFFFFFFFF),
               (ACL_ENTRIES["mask"], 4, 0xFFFFFFFF), (ACL_ENTRIES["other"], 4, 0xFFFFFFFF)]
    value = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)
    try:
        os.setxattr(path, "system.posix_acl_access", value)
    except OSError as error:
        pytest.skip(f"this file system keeps no ACLs: {error}")


def test_a_file_an_acl_closes_to_the_process_is_not_opened(place, nobody_process):
    secret = place / "acl-closed"
    secret.write_text("root's")
    secret.chmod(0o644)
    deny_acl(secret, NOBODY)
    assert os.stat(secret).st_mode & 0o004  # the mode bits alone would let nobody read it
    before = files.stats["unreadable_by_process"]
    assert files.open_process_file(nobody_process, str(secret)) is None
    assert files.stats["unreadable_by_process"] == before + 1


def test_a_file_in_a_directory_the_process_cannot_search_is_not_opened(place, nobody_process):
    closed = place / "closed"
    closed.mkdir(mode=0o700)
    secret = closed / "readable-by-all"
    secret.write_text("root's")
    secret.chmod(0o644)
    link = place / "link"  # what a debug link or a build-id symlink of the attacker's would name
    link.symlink_to(secret)
    for path in (secret, link):
        assert files.open_process_file(nobody_process, str(path)) is None, path


def test_what_the_process_may_read_is_opened_and_a_root_process_reads_all(place, nobody_process):
    open_to_all = place / "open"
    open_to_all.write_text("anyone's")
    open_to_all.chmod(0o644)
    fd = files.open_process_file(nobody_process, str(open_to_all))
    assert fd is not None and os.read(fd, 16) == b"anyone's"
    os.close(fd)
    closed = place / "closed-to-others"
    closed.write_text("root's")
    closed.chmod(0o600)
    root_process = ProcessTable().snapshot(os.getpid())
    fd = files.open_process_file(root_process, str(closed))
    assert fd is not None
    os.close(fd)
    assert files.open_process_file(nobody_process, str(closed)) is None


def test_a_path_is_called_absent_only_where_the_walk_as_the_process_finds_nothing(place, nobody_process):
    """absent_in_root, the cheap question a perf map is asked first each report, resolves a path
    as path_in_root does (in the root, absolute links kept inside it): absent only when that walk
    would find nothing, never where it would find a file."""
    (place / "elsewhere").mkdir()
    (place / "elsewhere" / "perf-1.map").write_text("1000 10 jitted\n")
    (place / "tmp").symlink_to("/elsewhere")  # (absolute: inside the root, not the agent's /elsewhere)
    closed = place / "closed"
    closed.mkdir(mode=0o700)
    (closed / "perf-2.map").write_text("")
    assert not files.absent_in_root(str(place), "/tmp/perf-1.map")
    os.close(files.path_in_root(str(place), "/tmp/perf-1.map", nobody_process.credentials, follow_last=False))
    assert files.absent_in_root(str(place), "/tmp/perf-9.map")
    with pytest.raises(FileNotFoundError):
        files.path_in_root(str(place), "/tmp/perf-9.map", nobody_process.credentials, follow_last=False)
    assert not files.absent_in_root(str(place), "/closed/perf-2.map")  # (there: the process may not search it, which the walk says)
    assert not files.absent_in_root(str(place / "gone"), "/tmp/perf-1.map")  # (a root that cannot be opened: the walk says why)


def test_acting_as_a_user_changes_the_calling_thread_alone_and_only_within_the_block(place):
    closed = place / "root-only"
    closed.write_text("root's")
    closed.chmod(0o600)
    inside, other_thread = [], []
    barrier = threading.Barrier(2)

    def read(into: list) -> None:
        try:
            with open(closed) as f:
                into.append(f.read())
        except PermissionError:
            into.append(None)

    def the_other_thread() -> None:
        barrier.wait()  # while the first acts as nobody
        read(other_thread)
        barrier.wait()

    groups = os.getgroups()
    thread = threading.Thread(target=the_other_thread)
    thread.start()
    with acting_as(Credentials(fsuid=NOBODY, fsgid=NOBODY)):
        read(inside)
        barrier.wait()
        barrier.wait()
    thread.join()
    after: list = []
    read(after)
    assert inside == [None] and other_thread == ["root's"] and after == ["root's"]
    assert os.getgroups() == groups and _fs_ids() == (0, 0)


def _fs_ids() -> tuple[int, int]:
    with open("/proc/thread-self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return int(fields["Uid"].split()[3]), int(fields["Gid"].split()[3])


# Run as the deployment runs the agent: opens each path as the process (pid argv[1]) would, and
# its mapped program through map_files; prints what opened and the thread's state after.
AS_DEPLOYED = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from receivers.profiling.processes import files
from receivers.profiling.processes.credentials import thread_capabilities
from receivers.profiling.processes.table import ProcessTable
info = ProcessTable().snapshot(int(sys.argv[2]))
before = thread_capabilities(), os.getgroups()
opened = {}
for path in sys.argv[3:]:
    fd = files.open_process_file(info, path)
    opened[path] = fd is not None and os.read(fd, 64).decode()
    if fd is not None:
        os.close(fd)
program = next(m for m in info.mappings if m.path.endswith("/sleep"))
fd = files.open_mapped_file(info, program)
opened["program"] = fd is not None and os.read(fd, 4) == b"\\x7fELF"
print(json.dumps({"opened": opened, "refused": files.stats["unreadable_by_process"],
                  "restored": (thread_capabilities(), os.getgroups()) == before}))
"""


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_as_deployed_the_agent_opens_what_the_process_may_read_and_nothing_more(place, nobody_process, deployment):
    """Under the systemd unit (a dynamic user holding CAP_DAC_READ_SEARCH) and the DaemonSet (root
    with its capabilities cut), a user's files are opened as that user: what it may read opens,
    and what only root may read does not, by path, by symlink, or behind an ACL or a closed
    directory, although the agent itself could read each of them."""
    open_to_all = place / "open"
    open_to_all.write_text("anyone's")
    open_to_all.chmod(0o644)
    root_only = place / "root-only"
    root_only.write_text("root's")
    root_only.chmod(0o600)
    link = place / "link-to-root-only"  # a perf map or debug link the process points at it
    link.symlink_to(root_only)
    acl_closed = place / "acl-closed"
    acl_closed.write_text("root's")
    acl_closed.chmod(0o644)
    deny_acl(acl_closed, NOBODY)
    (place / "closed").mkdir(mode=0o700)
    behind_closed = place / "closed" / "readable-by-all"
    behind_closed.write_text("root's")
    behind_closed.chmod(0o644)
    paths = [open_to_all, root_only, link, acl_closed, behind_closed]
    done = subprocess.run([*run_as_deployed(deployment), sys.executable, "-c", AS_DEPLOYED, str(REPO), str(nobody_process.pid),
                           *map(str, paths)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = __import__("json").loads(done.stdout)
    assert result["opened"] == {str(open_to_all): "anyone's", str(root_only): False, str(link): False,
                                str(acl_closed): False, str(behind_closed): False, "program": True}, done.stderr
    assert result["refused"] == 4 and result["restored"]
