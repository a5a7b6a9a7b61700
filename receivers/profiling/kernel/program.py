"""Getting the profiler's BPF program into the kernel and attached, and every way that fails.

``load`` takes the compiled program from the cache (program_cache.py) or has a child process
compile it with BCC (compiler.py), then loads it without BCC's compiler (loader.py). Each failure is
a ``SamplerError`` subclass whose message says what is wrong and what to do about it; ``log`` keeps
what clang, libbpf and the verifier printed. Only the compiler child imports ``bcc``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from receivers.profiling.kernel.loader import LoadedProgram
    from receivers.profiling.kernel.program_cache import ProgramCache

PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK = 1, 0

class SamplerError(RuntimeError):
    """The profiler cannot run.  `str(err)` is meant for the user; `log` holds BCC's output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class BPFPermissionError(SamplerError):
    """Not root and without CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN)."""


class KernelHeadersMissingError(SamplerError):
    """BCC found no kernel headers for the running kernel."""


class BPFCompileError(SamplerError):
    """clang rejected bpf/profile.bpf.c (the message carries BCC's diagnostics)."""


class BPFLoadError(SamplerError):
    """The kernel verifier rejected the program (the message carries the end of its log)."""


class BPFAttachError(SamplerError):
    """The program loaded but could not be attached to the cpu-clock perf event."""


def _capabilities() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39


def check_privileges() -> None:
    """Raise BPFPermissionError unless this process may load and attach the profiler."""
    caps = _capabilities()
    has = lambda cap: bool(caps >> cap & 1)  # noqa: E731
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    if not (has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON))):
        raise BPFPermissionError(
            f"eBPF profiling needs root or the capabilities CAP_BPF and CAP_PERFMON (this process "
            f"runs as {who} with CapEff={caps:#x}). Run the collector as root, or grant them with the "
            "others it needs (deploy/systemd/pycollector.service and deploy/kubernetes/agent.yaml list "
            "them all), with host PID namespace (`--pid=host`) in a container to see other processes."
        )


def kernel_headers_hint(release: str | None = None) -> str:
    release = release or os.uname().release
    return (
        f"BCC needs the kernel headers of the running kernel ({release}) to compile the "
        f"profiler. Install them (Debian/Ubuntu: `apt-get install linux-headers-{release}`; "
        f"Fedora/RHEL: `dnf install kernel-devel-{release}`), or `modprobe kheaders` if the "
        f"kernel has CONFIG_IKHEADERS. If no package matches this kernel, install the closest "
        f"headers and link them: `ln -s /usr/src/linux-headers-<version> "
        f"/lib/modules/{release}/build` (and the same for `source`), or set BCC_KERNEL_SOURCE."
    )


def find_kernel_headers() -> str | None:
    """Where BCC will find headers, or None (BCC looks in these places, in this order)."""
    if os.environ.get("BCC_KERNEL_SOURCE"):
        return os.environ["BCC_KERNEL_SOURCE"]
    release = os.uname().release
    for sub in ("build", "source"):
        path = f"/lib/modules/{release}/{sub}"
        if os.path.isdir(os.path.join(path, "include")) or os.path.isfile(
            os.path.join(path, "Makefile")
        ):
            return path
    if os.path.exists("/sys/kernel/kheaders.tar.xz"):
        return "/sys/kernel/kheaders.tar.xz"
    return None


@contextlib.contextmanager
def capture_stderr_fd() -> Iterator[list[str]]:
    """Capture what C code (clang, libbpf, the verifier log) writes to fd 2."""
    out: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode("utf-8", "replace"))


def tail(text: str, lines: int = 40) -> str:
    kept = text.strip().splitlines()[-lines:]
    return "\n".join(kept)



_LOCAL_PART = re.compile(r'^#include "([\w.-]+\.bpf\.c)"\s*$', re.M)


def program_text(source: Path) -> str:
    """The program as BCC compiles it: ``source`` with each ``#include "x.bpf.c"`` of its own
    folder pasted in.  BCC turns map calls (``counts.lookup(&key)``) into helper calls only in the
    text it is given, not in files clang includes, so a program in several files is pasted into one
    (a pasted file's own parts too)."""
    text = source.read_text()
    for _ in range(4):
        text, pasted = _LOCAL_PART.subn(lambda match: (source.parent / match.group(1)).read_text(), text)
        if not pasted:
            return text
    raise BPFCompileError(f"{source}: parts include each other")


def load(source: Path, cflags: list[str], verifier_log_level: int, functions: dict[bytes, str],
         cache: ProgramCache | None = None) -> tuple[LoadedProgram, str]:
    """``source`` compiled (or read from ``cache``) and each of ``functions`` (name -> program type
    name, "PERF_EVENT", "RAW_TRACEPOINT" or "KPROBE") loaded; the loaded program and what the compiler and
    verifier printed. Raises a SamplerError subclass; nothing stays loaded when it does."""
    from receivers.profiling.kernel.compiler import compile_in_child
    from receivers.profiling.kernel.loader import LoadedProgram
    from receivers.profiling.kernel.program_cache import cache_key

    check_privileges()
    if not source.is_file():
        raise BPFCompileError(f"BPF program not found: {source}")
    headers = find_kernel_headers()
    text = program_text(source)
    key = cache_key(text, source.parent, cflags, headers) if cache is not None else ""
    compiled = cache.get(key) if cache is not None else None
    if compiled is not None:
        try:
            loaded = LoadedProgram.load(compiled, functions, verifier_log_level)
            return loaded, loaded.log
        except BPFPermissionError:
            raise
        except SamplerError as error:  # (a kernel that changed under the same release, say: compile afresh)
            cache.discard(key, f"the kernel refused it: {str(error).splitlines()[0]}")
    if headers is None:
        raise KernelHeadersMissingError(kernel_headers_hint())
    began = time.monotonic()
    compiled, compile_log = compile_in_child(source, text, cflags)
    compile_seconds = time.monotonic() - began
    loaded = LoadedProgram.load(compiled, functions, verifier_log_level)
    loaded.compile_seconds = compile_seconds
    if cache is not None:
        cache.put(key, compiled)  # (once the kernel took it)
    return loaded, compile_log + loaded.log


def attach_cpu_clock(bpf, function: bytes, frequency_hz: int) -> None:
    """Run ``function`` on every CPU at ``frequency_hz`` from the software cpu-clock event."""
    try:
        bpf.attach_perf_event(function, PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK, frequency_hz)
    except OSError as e:
        err = e.errno
        hint = ""
        if err == errno.EINVAL:
            hint = " (is samples_per_second above /proc/sys/kernel/perf_event_max_sample_rate?)"
        elif err in (errno.EACCES, errno.EPERM):
            hint = " (needs CAP_PERFMON or kernel.perf_event_paranoid <= 0)"
        raise BPFAttachError(
            f"could not attach to the cpu-clock perf event at {frequency_hz} Hz: "
            f"{os.strerror(err) if err else e}{hint}"
        ) from e


def attach_raw_tracepoint(bpf, tracepoint: bytes, program: bytes, hint: str = "") -> None:
    """Run ``program`` on the kernel's ``tracepoint`` (e.g. sched_switch); ``hint`` says what the
    program needs of it, for the error."""
    try:
        bpf.attach_raw_tracepoint(tracepoint, program)
    except OSError as e:
        err = e.errno
        raise BPFAttachError(f"could not attach to the {tracepoint.decode()} tracepoint: {os.strerror(err) if err else e}"
                             + (f" ({hint})" if hint else "")) from e
