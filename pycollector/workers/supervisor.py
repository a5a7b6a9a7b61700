"""The supervising process of a collector that runs its pipelines in several worker processes.

Each worker (pycollector.workers.worker) runs every pipeline and listens on the config's ports
itself, with SO_REUSEPORT: the kernel spreads new connections over the workers' sockets, and no
byte passes through this process. This one starts the workers, replaces one that dies, stops
them all, and is the collector the outside sees: the one metrics page (the workers' series added
up, pycollector.workers.merge) and the extensions placed here (health_check, answering from every
worker's component statuses).

A worker that dies (killed, crashed, a fatal error) is started again at once, or, while its
replacements keep dying young, after a pause that doubles up to MAX_RESTART_PAUSE. Its clients
see their connections reset: a retryable error (UNAVAILABLE), their retry reaches a live worker.
What it had accepted and not yet sent is accounted for from its last metrics (every
SNAPSHOT_INTERVAL): items in a memory queue are counted as lost and logged; a persistent queue
is per worker (directory/worker-N) and its replacement sends what it held.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from prometheus_client.registry import Collector

from pycollector.component import StartError
from pycollector.config.validate import Plan
from pycollector.logs import get_logger
from pycollector.service import Service, Status
from pycollector.telemetry import Telemetry
from pycollector.workers.channel import Channel
from pycollector.workers.merge import merged_families
from pycollector.workers.plans import supervisor_plan
from pycollector.workers.worker import metric_families

START_TIMEOUT = 120.0  # a worker that has not started (or failed) by then is taken as failed
STOP_TIMEOUT = 60.0  # a worker still stopping then is killed
SCRAPE_TIMEOUT = 2.0
SNAPSHOT_INTERVAL = 5.0
YOUNG = 10.0  # a worker that dies younger than this is restarted after a pause
FIRST_RESTART_PAUSE, MAX_RESTART_PAUSE = 0.5, 30.0
QUEUE_SIZE = "otelcol_exporter_queue_size"


class WorkerProcess:
    """One worker slot: its current process, channel and what it last said."""

    def __init__(self, index: int):
        self.index = index
        self.process: subprocess.Popen | None = None
        self.channel: Channel | None = None
        self.started_at = 0.0
        self.started = threading.Event()
        self.failure: str | None = None  # why it could not start, or its fatal error
        self.sources: set[str] = set()  # the component statuses it reported
        self.snapshot: list[tuple] = []
        self.snapshot_at = 0.0
        self.young_deaths = 0  # deaths in a row within YOUNG of their start
        self.restart_at: float | None = None
        self.replacements = 0
        self.listener: threading.Thread | None = None  # reads what the process says, until it ends
        self._replies: dict[int, Any] = {}
        self._asked: set[int] = set()  # requests still waited for
        self._replied = threading.Condition()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ask_metrics(self, request_id: int, timeout: float) -> list[tuple] | None:
        channel = self.channel
        if channel is None or not self.started.is_set():
            return None
        with self._replied:
            self._asked.add(request_id)
        sent = channel.send(("metrics", request_id))
        with self._replied:
            if sent:
                self._replied.wait_for(lambda: request_id in self._replies, timeout)
            self._asked.discard(request_id)  # (an answer later than the timeout is dropped)
            families = self._replies.pop(request_id, None)
        if families is not None:
            self.snapshot, self.snapshot_at = families, time.monotonic()
        return families

    def take_reply(self, request_id: int, families: list[tuple]) -> None:
        with self._replied:
            if request_id not in self._asked:
                return
            self._replies[request_id] = families
            self._replied.notify_all()


class Supervisor:
    def __init__(self, plan: Plan, config: dict, count: int, log_format: str, log_level: str):
        self.plan = plan
        self.count = count
        self._setup = {"config": config, "count": count, "log_format": log_format, "log_level": log_level}
        self.log = get_logger(component="workers")
        self.telemetry = Telemetry(process_metrics=False)
        self.telemetry.registry.register(_WorkersCollector(self))
        self.service = Service(supervisor_plan(plan), self.telemetry)
        self.workers = [WorkerProcess(index) for index in range(count)]
        self._stopping = threading.Event()
        self._request_ids = itertools.count(1)
        self._running = self.telemetry.gauge("pycollector_workers", "Worker processes running the pipelines.")
        self._restarts = self.telemetry.counter("pycollector_worker_restarts", "Worker processes started again after one ended unasked.")
        self._lost = self.telemetry.counter(
            "pycollector_worker_lost_items",
            "Items a worker that ended unasked held in memory queues (as of its last metrics); persistent queues are resumed by its replacement.")
        self._persistent_queues = {name for (kind, name), spec in plan.components.items()
                                   if kind == "exporters" and getattr(getattr(spec.config, "sending_queue", None), "storage", None)}

    # -- lifecycle ---------------------------------------------------------------------------------

    def run(self) -> int:
        """Start everything, supervise until SIGTERM/SIGINT, stop everything; the exit code."""
        begun = time.monotonic()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._stop_signal)
        try:
            self.service.start(announce=False)
            self._start_all()
        except StartError as error:
            self.log.error("could not start", reason=str(error))
            self._stop_all()
            return 1
        address = self.service.metrics_address
        self.log.info("pycollector started", pipelines=", ".join(self.plan.pipelines), workers=self.count,
                      metrics=f"http://{address[0]}:{address[1]}/metrics" if address else "off", seconds=round(time.monotonic() - begun, 2))
        threading.Thread(target=self._take_snapshots, name="worker-snapshots", daemon=True).start()
        while not self._stopping.wait(0.1):
            self._watch()
        return self._stop_all()

    def _stop_signal(self, signum, _frame) -> None:
        self.log.info("stopping", signal=signal.Signals(signum).name, workers=self.count)
        self._stopping.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _start_all(self) -> None:
        """Start every worker and wait until each has started; a stop asked meanwhile comes
        after, as a lone collector's does (its start runs to its end, then it stops)."""
        for worker in self.workers:
            self._spawn(worker)
        deadline = time.monotonic() + START_TIMEOUT
        for worker in self.workers:
            while not worker.started.wait(0.1):
                if not worker.alive and worker.listener is not None:
                    worker.listener.join(1.0)  # (what it said before it ended: why it could not start)
                if worker.failure is not None or not worker.alive or time.monotonic() > deadline:
                    reason = worker.failure or ("exited" if not worker.alive else f"not started after {START_TIMEOUT:.0f} s")
                    raise StartError(f"worker {worker.index}: {reason}")

    def _stop_all(self) -> int:
        """SIGTERM to every worker, SIGKILL to one still running after STOP_TIMEOUT; 0 when all
        stopped cleanly."""
        for worker in self.workers:
            if worker.alive:
                worker.process.send_signal(signal.SIGTERM)
        clean = True
        deadline = time.monotonic() + STOP_TIMEOUT
        for worker in self.workers:
            if worker.process is None or worker.restart_at is not None:
                continue  # (never started, or ended earlier and told of then)
            try:
                code = worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log.error("worker did not stop in time; killing it", worker=worker.index, seconds=STOP_TIMEOUT)
                worker.process.kill()
                code = worker.process.wait()
            # (one stopped before it had set its handler had nothing to flush)
            if code != 0 and not (code == -signal.SIGTERM and not worker.started.is_set()):
                clean = False
                self.log.error("worker stopped with an error", worker=worker.index, code=code, error=worker.failure)
            if worker.channel is not None:
                worker.channel.close()
        self._running.set(0)
        self.service.shutdown()
        self.log.info("stopped cleanly" if clean else "stopped")
        return 0 if clean else 1

    # -- one worker ---------------------------------------------------------------------------------

    def _spawn(self, worker: WorkerProcess) -> None:
        ours, theirs = socket.socketpair()
        worker.started.clear()
        worker.failure = None
        worker.snapshot = []
        worker.process = subprocess.Popen([sys.executable, "-m", "pycollector.workers.worker", str(theirs.fileno()), str(os.getpid())],
                                          pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        worker.started_at = time.monotonic()
        worker.channel = Channel(ours)
        worker.channel.send({**self._setup, "index": worker.index})
        worker.listener = threading.Thread(target=self._listen, args=(worker, worker.channel), name=f"worker-{worker.index}", daemon=True)
        worker.listener.start()
        self._running.set(sum(w.alive for w in self.workers))

    def _listen(self, worker: WorkerProcess, channel: Channel) -> None:
        """What one worker process says, until it ends."""
        while True:
            message = channel.receive()
            if message is None:
                return
            kind = message[0]
            if kind == "status":
                _, source, status, error = message
                worker.sources.add(source)
                self.service.report_status(_worker_source(source, worker.index), status, RuntimeError(error) if error else None)
            elif kind == "metrics":
                worker.take_reply(message[1], message[2])
            elif kind == "started":
                worker.started.set()
                if worker.replacements:
                    self.log.info("worker replaced", worker=worker.index, pid=worker.process.pid,
                                  seconds=round(time.monotonic() - worker.started_at, 2))
            elif kind in ("failed", "fatal"):
                worker.failure = message[1] if kind == "failed" else f"{message[1]}: {message[2]}"

    def _watch(self) -> None:
        """Replace a worker that ended unasked (after its pause, when it died young)."""
        now = time.monotonic()
        for worker in self.workers:
            if worker.restart_at is not None:
                if now >= worker.restart_at and not self._stopping.is_set():
                    worker.restart_at = None
                    worker.replacements += 1
                    self._restarts.inc()
                    self._spawn(worker)
                continue
            if worker.alive:
                continue
            self._ended(worker, now)

    def _ended(self, worker: WorkerProcess, now: float) -> None:
        code = worker.process.returncode
        lived = now - worker.started_at
        # A pause only when its replacements keep dying young (a crash at start, a bad host): the
        # first death, or one after a worker that had lived, is replaced at once.
        young = lived < YOUNG or not worker.started.is_set()
        worker.young_deaths = worker.young_deaths + 1 if young else 0
        pause = 0.0 if worker.young_deaths <= 1 else min(MAX_RESTART_PAUSE, FIRST_RESTART_PAUSE * 2 ** (worker.young_deaths - 2))
        worker.restart_at = now + pause
        if worker.channel is not None:
            worker.channel.close()
            worker.channel = None
        lost, kept = self._in_queues(worker.snapshot)
        self._lost.inc(lost)
        ended = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        self.log.error("worker ended; starting another", worker=worker.index, pid=worker.process.pid, how=ended, error=worker.failure,
                       lived_s=round(lived, 1), pause_s=round(pause, 2),
                       lost_items=lost, persistent_items=kept, as_of_s_before=round(now - worker.snapshot_at, 1) if worker.snapshot else None)
        for source in worker.sources:
            self.service.report_status(_worker_source(source, worker.index), Status.RECOVERABLE_ERROR,
                                       RuntimeError(f"worker {worker.index} {ended}; another is starting"))
        self._running.set(sum(w.alive for w in self.workers))

    def _in_queues(self, families: list[tuple]) -> tuple[int, int]:
        """(items in memory queues, items in persistent queues) in a worker's metrics."""
        lost = kept = 0
        for name, _kind, _doc, _unit, samples in families:
            if name != QUEUE_SIZE:
                continue
            for _sample, labels, value in samples:
                if labels.get("exporter") in self._persistent_queues:
                    kept += int(value)
                else:
                    lost += int(value)
        return lost, kept

    # -- metrics ----------------------------------------------------------------------------------

    def scrape(self) -> list[list[tuple]]:
        """Every started worker's metric families (asked at once, each answering within
        SCRAPE_TIMEOUT), and this process's own."""
        request_id = next(self._request_ids)
        answers: list[list[tuple]] = []
        threads = [threading.Thread(target=lambda w=worker: answers.append(w.ask_metrics(request_id, SCRAPE_TIMEOUT) or []))
                   for worker in self.workers if worker.alive]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return answers + [metric_families(self.telemetry.process)]  # (a collector: it has collect() too)

    def _take_snapshots(self) -> None:
        while not self._stopping.wait(SNAPSHOT_INTERVAL):
            self.scrape()


def _worker_source(source: str, index: int) -> str:
    return f"{source} (worker {index})"


class _WorkersCollector(Collector):
    def __init__(self, supervisor: Supervisor):
        self._supervisor = supervisor

    def collect(self):
        return merged_families(self._supervisor.scrape())

    def describe(self):
        return []  # (the series come from the workers at scrape time)

