"""Compiled programs kept on disk, so a restart loads the profiler without compiling it.

A compiled program depends on the program's text and the headers clang read (bpf/), the flags
(which carry offsets into the running kernel's structures), the kernel (release, build, its
headers), the number of possible CPUs (BCC sizes perf output maps by it) and BCC's version; the
file is named by the SHA-256 of all of them, so anything that changes one of them misses.

The agent loads what it reads here into the kernel as root, so the cache trusts only what root
could have written: the directory must be owned by this user, not writable by group or others,
and reached through directories nobody else can rename it out of; a file must be a regular file of
this user's, not writable by others, opened without following links or blocking (a FIFO). A file
that fails any check, or that does not parse as a whole compiled program (compiled.py checks every
field), is ignored with a warning and compiled again. Writes go through a temporary file renamed
into place. ``prune`` keeps the ``MAX_FILES`` most recently used.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from receivers.profiling.kernel.compiled import FORMAT, CompiledProgram
from pycollector.trusted_directory import UntrustedDirectoryError, check_own_directory

SUFFIX = ".bpf.json"
# What BCC's compile reads from the environment besides the headers' location.
_BCC_ENVIRONMENT = ("BCC_KERNEL_SOURCE", "BCC_LINUX_VERSION_CODE", "ARCH", "BCC_SYMFS")
_EXTRACTION_MODULES = ("compiler.py", "compiled.py", "ctypes_layout.py")
MAX_FILES = 32
MAX_FILE_BYTES = 64 << 20


class UntrustedCacheError(UntrustedDirectoryError):
    """The cache file could have been written by someone other than this user."""


def cache_key(program_text: str, include_dir: Path, cflags: list[str], kernel_headers: str | None) -> str:
    """The name of the compiled program these inputs make."""
    digest = hashlib.sha256()

    def feed(*parts: str | bytes) -> None:
        for part in parts:
            data = part.encode() if isinstance(part, str) else part
            digest.update(len(data).to_bytes(8, "little") + data)

    uname = os.uname()
    feed(f"format {FORMAT}", uname.release, uname.version, uname.machine, _read("/sys/devices/system/cpu/possible"))
    feed(program_text, *cflags, _bcc_version(), *_libbcc_identity())
    feed(*(f"{name}={os.environ.get(name, '')}" for name in _BCC_ENVIRONMENT))
    for module in _EXTRACTION_MODULES:  # (how a compiled program is taken out of BCC and written)
        feed(Path(__file__).with_name(module).read_bytes())
    for path in sorted(include_dir.iterdir()):
        if path.is_file():
            feed(path.name, path.read_bytes())
    if kernel_headers:
        feed(os.path.realpath(kernel_headers))
        for generated in ("include/generated/autoconf.h", "include/generated/utsrelease.h", "include/config/auto.conf"):
            feed(_read(os.path.join(kernel_headers, generated)))
    return digest.hexdigest()


class ProgramCache:
    def __init__(self, directory: str, logger: Any) -> None:
        """``directory``: where compiled programs are kept ("" keeps none)."""
        # (Absolute, its links resolved once: the directory checked is the one files are opened in.)
        self.directory = os.path.realpath(directory) if directory else ""
        self.log = logger
        self.stats = dict.fromkeys(("hits", "misses", "rejected", "write_errors"), 0)

    def get(self, key: str) -> CompiledProgram | None:
        if not self.directory:
            return None
        path = self._path(key)
        try:
            self._check_directory(create=False)
            data = _read_trusted(path)
        except FileNotFoundError:
            self.stats["misses"] += 1
            return None
        except (OSError, UntrustedDirectoryError) as error:
            self.stats["rejected"] += 1
            self.log.warning("compiled BPF program cache not used: compiling instead", path=path, reason=str(error))
            return None
        try:
            program = CompiledProgram.from_json(data)
        except Exception as error:  # (from_json says ProgramFormatError; nothing read here may stop the agent)
            self.stats["rejected"] += 1
            self.log.warning("compiled BPF program in the cache is damaged or of another version: compiling it again",
                             path=path, reason=str(error))
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used: prune() keeps the most recently used
        self.stats["hits"] += 1
        self.log.info("BPF program loaded from the cache, not compiled", path=path)
        return program

    def discard(self, key: str, reason: str) -> None:
        """A kept program that turned out unusable: removed, so the next start does not try it."""
        if not self.directory:
            return
        self.stats["rejected"] += 1
        self.log.warning("compiled BPF program in the cache cannot be used: compiling it again", path=self._path(key), reason=reason)
        with contextlib.suppress(OSError):
            os.unlink(self._path(key))

    def put(self, key: str, program: CompiledProgram) -> None:
        if not self.directory:
            return
        try:
            self._check_directory(create=True)
            descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=".program-")
            try:
                with os.fdopen(descriptor, "wb") as stream:
                    stream.write(program.to_json())
                os.replace(temporary, self._path(key))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            self.prune()
        except (OSError, UntrustedDirectoryError) as error:
            self.stats["write_errors"] += 1
            self.log.warning("cannot keep the compiled BPF program: each start will compile it "
                             "(set bpf_cache_dir to a directory only the agent's user can write, or \"\" to keep none)",
                             directory=self.directory, error=str(error))

    def prune(self, keep: int = MAX_FILES) -> None:
        try:
            entries = [entry for entry in os.scandir(self.directory)
                       if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False)]
        except OSError:
            return
        def used_at(entry: os.DirEntry) -> float:
            try:
                return entry.stat(follow_symlinks=False).st_mtime
            except OSError:  # (another agent pruned it meanwhile)
                return 0.0

        entries.sort(key=used_at, reverse=True)
        for entry in entries[keep:]:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key + SUFFIX)

    def _check_directory(self, create: bool) -> None:
        check_own_directory(self.directory, create)


def _read_trusted(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as stream:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise UntrustedCacheError("not a regular file")
        if status.st_uid != os.geteuid() or status.st_mode & 0o022:
            raise UntrustedCacheError(f"owned by uid {status.st_uid} with mode {status.st_mode & 0o7777:o}")
        if status.st_nlink != 1:  # (a hard link to a file placed elsewhere)
            raise UntrustedCacheError(f"{status.st_nlink} links to it")
        if status.st_size > MAX_FILE_BYTES:
            raise UntrustedCacheError(f"{status.st_size} bytes")
        return stream.read(MAX_FILE_BYTES + 1)


def _read(path: str) -> str:
    try:
        with open(path, "rb") as stream:
            return stream.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


def _libbcc_identity() -> list[str]:
    """Which libbcc (and so which clang and LLVM) would compile: its file's path, size and time."""
    for directory in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu"):
        path = os.path.join(directory, "libbcc.so.0")
        with contextlib.suppress(OSError):
            status = os.stat(path)
            return [os.path.realpath(path), str(status.st_size), str(status.st_mtime_ns)]
    return []


def _bcc_version() -> str:
    """BCC's version, read without importing BCC (which loads LLVM)."""
    spec = importlib.util.find_spec("bcc")
    if spec is None or not spec.origin:
        return ""
    return _read(os.path.join(os.path.dirname(spec.origin), "version.py"))
