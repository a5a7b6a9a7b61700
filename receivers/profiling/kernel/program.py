"""Compiling, loading and attaching the profiler's BPF program with BCC, and every way that fails.

Each failure is a ``SamplerError`` subclass whose message says what is wrong and what to do about
it; ``log`` keeps what clang, libbpf and the verifier printed.  ``bcc`` is imported by ``load()``
only, so importing this module does not need BCC.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

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
    if has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON)):
        return
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    raise BPFPermissionError(
        f"eBPF profiling needs root or the capabilities CAP_BPF and CAP_PERFMON (this process "
        f"runs as {who} with CapEff={caps:#x}). Run the collector as root, or grant them: "
        "`setcap cap_bpf,cap_perfmon,cap_sys_resource+ep <python>`, or in a container "
        "`--cap-add BPF --cap-add PERFMON` (or `--privileged`), with host PID namespace "
        "(`--pid=host`) to see other processes."
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
def _capture_stderr_fd() -> Iterator[list[str]]:
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


def _tail(text: str, lines: int = 40) -> str:
    kept = text.strip().splitlines()[-lines:]
    return "\n".join(kept)



_LOCAL_PART = re.compile(r'^#include "([\w.-]+\.bpf\.c)"\s*$', re.M)


def program_text(source: Path) -> str:
    """The program as BCC compiles it: ``source`` with each ``#include "x.bpf.c"`` of its own
    folder pasted in.  BCC turns map calls (``counts.lookup(&key)``) into helper calls only in the
    text it is given, not in files clang includes, so a program in several files is pasted into one."""
    return _LOCAL_PART.sub(lambda match: (source.parent / match.group(1)).read_text(), source.read_text())


def load(source: Path, cflags: list[str], verifier_log_level: int, functions: dict[bytes, str]) -> tuple[object, str]:
    """Compile ``source`` and load each of ``functions`` (name -> BCC program type name, e.g.
    "PERF_EVENT"); the BPF object and what the compiler and verifier printed.  Raises a
    SamplerError subclass; nothing stays loaded when it does."""
    check_privileges()
    if find_kernel_headers() is None:
        raise KernelHeadersMissingError(kernel_headers_hint())
    if not source.is_file():
        raise BPFCompileError(f"BPF program not found: {source}")
    try:
        import bcc
    except ImportError as e:
        raise SamplerError(
            "the `bcc` Python module is missing: install BCC's Python bindings "
            "(Debian/Ubuntu: `apt-get install python3-bpfcc`; the virtualenv must see system "
            f"site-packages) ({e})"
        ) from e

    debug = {1: bcc.DEBUG_BPF, 2: bcc.DEBUG_BPF_REGISTER_STATE}.get(verifier_log_level, 0)
    logs: list[str] = []
    bpf = None
    try:
        with _capture_stderr_fd() as out:
            try:
                bpf = bcc.BPF(text=program_text(source).encode(), cflags=cflags, debug=debug)
            except Exception as e:  # BCC raises bare Exception
                failure = e
            else:
                failure = None
        logs.extend(out)
        if failure is not None:
            log = "".join(logs)
            if "kernel headers" in log.lower() or "linux/kconfig.h" in log:
                raise KernelHeadersMissingError(kernel_headers_hint(), log) from failure
            if "super-user" in str(failure) or "Operation not permitted" in log:
                raise BPFPermissionError(f"loading BPF was refused: {failure}", log)
            raise BPFCompileError(f"BCC could not compile {source}: {failure}\n{_tail(log)}", log) from failure
        for name, program_type in functions.items():
            with _capture_stderr_fd() as out:
                try:
                    bpf.load_func(name, getattr(bcc.BPF, program_type))
                except Exception as e:
                    failure = e
                    err = ct.get_errno()
                else:
                    failure = None
            logs.extend(out)
            if failure is not None:
                log = "".join(logs)
                if "super-user" in str(failure) or err == errno.EPERM:
                    raise BPFPermissionError(f"the kernel refused to load BPF: {failure}", log)
                raise BPFLoadError(f"the kernel verifier rejected {name.decode()}: {failure}\n{_tail(log)}", log) from failure
    except BaseException:
        if bpf is not None:
            with contextlib.suppress(Exception):
                bpf.cleanup()
        raise
    return bpf, "".join(logs)


def attach_cpu_clock(bpf, function: bytes, frequency_hz: int) -> None:
    """Run ``function`` on every CPU at ``frequency_hz`` from the software cpu-clock event."""
    import bcc

    try:
        bpf.attach_perf_event(
            ev_type=bcc.PerfType.SOFTWARE,
            ev_config=bcc.PerfSWConfig.CPU_CLOCK,
            fn_name=function,
            sample_freq=frequency_hz,
            cpu=-1,
        )
    except Exception as e:
        err = ct.get_errno()
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
        bpf.attach_raw_tracepoint(tp=tracepoint, fn_name=program)
    except Exception as e:
        err = ct.get_errno()
        raise BPFAttachError(f"could not attach to the {tracepoint.decode()} tracepoint: {os.strerror(err) if err else e}"
                             + (f" ({hint})" if hint else "")) from e
