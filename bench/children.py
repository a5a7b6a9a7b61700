"""Every process the bench starts (profilers, workloads, collectors) goes through here, so that
each one is stopped even when the bench fails or is interrupted half way (stop_on_signals makes
SIGTERM unwind like Ctrl-C, so that the cleanup runs then too)."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

_running: list[subprocess.Popen] = []


def start(argv: list[str], **popen_args: Any) -> subprocess.Popen:
    process = subprocess.Popen(argv, **popen_args)
    _running.append(process)
    return process


def stop(*processes: subprocess.Popen, timeout: float = 30.0) -> list[int]:
    """Interrupt them all at once (profilers write their output on SIGINT), then wait for each,
    killing one that outlasts the timeout; returns the exit codes."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes:
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        forget(process)
    return [process.returncode for process in processes]


def forget(process: subprocess.Popen) -> None:
    """The process has been reaped by its owner."""
    if process in _running:
        _running.remove(process)


def kill_all() -> None:
    """Kill whatever is still running, newest first."""
    while _running:
        process = _running.pop()
        if process.poll() is None:
            process.kill()
            process.wait()


def stop_on_signals() -> dict:
    """SIGTERM unwinds like Ctrl-C, so the cleanup runs. A Python handler for SIGINT is also
    reset to the default in children, where an inherited "ignore" (a shell's background job)
    would keep perf and profile-bpfcc from ever hearing our SIGINT. Returns what to restore."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return before


def restore_signals(handlers: dict) -> None:
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
