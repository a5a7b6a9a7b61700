"""One worker process of a multi-worker collector: ``python -m pycollector.workers.worker FD PID``,
started by the supervisor (PID) with its end of a socketpair as FD.

It reads its setup (the resolved config, which worker it is, how to log), runs the pipelines as
a lone collector would (``Service``), and on the channel: tells the supervisor every component
status and that it started (or why it could not), and answers its requests for metrics. It stops
on SIGTERM, or when the supervisor's channel closes. A supervisor that is killed takes its
workers with it (SIGKILL, as for a lone collector killed): a collector started again must not find
the old one's workers still serving its ports and writing its stores. Ctrl-C in a terminal reaches
the whole process group, and the supervisor, not the worker, decides what it means.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

from pycollector import logs, process_memory
from pycollector.component import StartError, WorkerSlot
from pycollector.config.validate import build_plan
from pycollector.registry import Registry
from pycollector.workers.channel import Channel
from pycollector.workers.plans import worker_plan


def metric_families(registry) -> list[tuple]:
    """The registry's families as plain tuples: (name, type, documentation, unit, samples), each
    sample (name, labels, value)."""
    return [(family.name, family.type, family.documentation, family.unit,
             [(sample.name, dict(sample.labels), sample.value) for sample in family.samples])
            for family in registry.collect()]


PR_SET_PDEATHSIG = 1


def _die_with(supervisor_pid: int) -> None:
    """SIGKILL when the supervisor ends; ended already (before this call): exit now."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != supervisor_pid:
        os._exit(1)


def main(argv: list[str]) -> int:
    _die_with(int(argv[1]))
    process_memory.limit_heaps()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop_asked = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop_asked.set())
    channel = Channel.from_fd(int(argv[0]))
    setup = channel.receive()
    if setup is None:
        return 1
    slot = WorkerSlot(setup["index"], setup["count"])
    logs.configure(setup["log_format"], setup["log_level"], process_fields={"worker": slot.index})
    from pycollector.service import Service  # (after logging is set: it binds loggers on import)

    service = Service(worker_plan(build_plan(setup["config"], Registry()), slot), worker=slot)
    service.status_watchers.append(lambda source, status, error: channel.send(("status", source, status, str(error) if error else None)))
    signal.signal(signal.SIGTERM, lambda _signum, _frame: service.request_stop())
    if stop_asked.is_set():
        return 0
    threading.Thread(target=_answer, args=(channel, service), name="worker-channel", daemon=True).start()
    try:
        service.start(announce=False)  # (the supervisor says when every worker has started)
    except StartError as error:
        channel.send(("failed", str(error)))
        return 1
    channel.send(("started",))
    while not service.wait(0.5):
        pass
    service.shutdown()
    if service.fatal_error is not None:
        source, error = service.fatal_error
        channel.send(("fatal", source, str(error)))
        return 1
    return 0


def _answer(channel: Channel, service) -> None:
    """The supervisor's requests, until it is gone (then this worker stops)."""
    while True:
        request = channel.receive()
        if request is None:
            service.request_stop()
            return
        if request[0] == "metrics":
            channel.send(("metrics", request[1], metric_families(service.telemetry.registry)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
