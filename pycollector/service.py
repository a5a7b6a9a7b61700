"""A running collector: extensions and the pipeline graph, started and stopped in order."""

from __future__ import annotations

import threading
import time
from typing import Any

from pycollector.component import SOLE_WORKER, Settings, StartError, WorkerSlot
from pycollector.config.validate import Plan
from pycollector.graph import Graph
from pycollector.logs import get_logger, log_once
from pycollector.telemetry import Telemetry


class Status:
    """Component statuses, as the Go collector's component status events name them."""

    STARTING = "starting"
    OK = "ok"
    RECOVERABLE_ERROR = "recoverable_error"  # running, but e.g. the backend is unreachable
    FAILED = "failed"  # could not start
    FATAL = "fatal"  # stopped the collector
    STOPPING = "stopping"
    STOPPED = "stopped"


def log_deprecated_names(plan: Plan, log: Any) -> None:
    """One warning per deprecated type name in use, listing where it is used."""
    places: dict[tuple[str, str], list[str]] = {}
    for path, alias, type_ in plan.aliases_used:
        places.setdefault((alias, type_), []).append(path)
    for (alias, type_), paths in places.items():
        log_once(log, ("alias", alias), "warning", f"'{alias}' is a deprecated name; use '{type_}'", used_in=", ".join(paths))


class Service:
    """Owns every component of one config. ``start`` then ``wait`` then ``shutdown``.

    A failed start shuts down what had started (in the safe order) and raises StartError naming
    the component. A component that fails later calls ``host.report_fatal_error``, which stops
    the service with a non-zero outcome.
    """

    def __init__(self, plan: Plan, telemetry: Telemetry | None = None, worker: WorkerSlot = SOLE_WORKER):
        self.plan = plan
        self.telemetry = telemetry or Telemetry()
        self.worker = worker
        self.log = get_logger(component="service")
        if not worker.shared:  # (with several workers, their supervisor says it once)
            log_deprecated_names(plan, self.log)
        self.graph = Graph(plan, self.telemetry, worker)
        self.extensions: dict[str, Any] = {}
        self._started: list[tuple[str, Any]] = []
        self._stop = threading.Event()
        self.fatal_error: tuple[str, BaseException] | None = None
        self.metrics_address: tuple[str, int] | None = None
        self._shutdown_lock = threading.Lock()
        # Latest status of every component, by its place ("exporters::otlp_grpc/backend").
        self.statuses: dict[str, tuple[str, BaseException | None]] = {}
        # Told every status too, as (source, status, error): a worker process passes them on to
        # its supervisor.
        self.status_watchers: list = []

    # -- Host, as components see it ---------------------------------------------------------------

    def get_extension(self, component_id: str) -> Any:
        return self.extensions.get(component_id)

    def report_fatal_error(self, source: str, error: BaseException) -> None:
        self.log.error("fatal error from a component; stopping", source=source, error=str(error))
        self.report_status(source, Status.FATAL, error)
        if self.fatal_error is None:
            self.fatal_error = (source, error)
        self._stop.set()

    def report_status(self, source: str, status: str, error: BaseException | None = None) -> None:
        """Record a component's status and tell every extension that watches statuses
        (one with ``on_component_status(source, status, error)``, e.g. health_check)."""
        self.statuses[source] = (status, error)
        for watcher in self.status_watchers:
            watcher(source, status, error)
        for name, extension in self.extensions.items():
            watcher = getattr(extension, "on_component_status", None)
            if watcher is None:
                continue
            try:
                watcher(source, status, error)
            except Exception as watcher_error:
                self.log.error("extension failed to take a status event", extension=name, error=str(watcher_error))

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, announce: bool = True) -> None:
        """Start extensions, then the pipelines sinks first; ``announce`` logs "pycollector started"."""
        begun = time.monotonic()
        for name in self.plan.extensions:
            spec = self.plan.component("extensions", name)
            settings = Settings(spec.id, "extensions", get_logger(component=spec.path), self.telemetry.for_component("extensions", name), self.worker)
            try:
                self.extensions[name] = spec.factory.create(settings, spec.config, None)
            except Exception as error:
                raise StartError(f"{spec.path}: cannot create: {error}") from error
        self.graph.create()
        self._serve_metrics()
        steps = [(f"extensions::{name}", component) for name, component in self.extensions.items()]
        steps += [(str(node.key), node.component) for node in self.graph.start_order()]
        for where, component in steps:
            self.report_status(where, Status.STARTING)
            try:
                component.start(self)
            except Exception as error:  # a plugin may raise anything; the user needs the reason
                self.log.error("component failed to start; stopping what had started", where=where, error=str(error))
                self.report_status(where, Status.FAILED, error)
                self.shutdown()
                raise StartError(f"{where}: failed to start: {error}") from error
            self._started.append((where, component))
            self.report_status(where, Status.OK)
        if announce:
            self._announce(begun)

    def _announce(self, begun: float) -> None:
        self.log.info(
            "pycollector started",
            pipelines=", ".join(self.plan.pipelines),
            metrics=f"http://{self.metrics_address[0]}:{self.metrics_address[1]}/metrics" if self.metrics_address else "off",
            seconds=round(time.monotonic() - begun, 2),
        )

    def _serve_metrics(self) -> None:
        address = self.plan.telemetry.metrics.listen_address()
        if address is None:
            return
        try:
            self.metrics_address = self.telemetry.serve(*address)
        except OSError as error:
            raise StartError(f"service::telemetry::metrics: cannot listen on {address[0]}:{address[1]}: {error.strerror or error}") from error

    def request_stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested; True if it was."""
        return self._stop.wait(timeout)

    def shutdown(self) -> None:
        """Stop receivers first, then processors, exporters, extensions. Safe to call twice."""
        with self._shutdown_lock:
            started = dict((id(component), where) for where, component in self._started)
            self._started.clear()
            order = [node.component for node in self.graph.shutdown_order()] + list(reversed(self.extensions.values()))
            for component in order:
                where = started.pop(id(component), None)
                if where is None:
                    continue
                self.report_status(where, Status.STOPPING)
                try:
                    component.shutdown()
                except Exception as error:
                    self.log.error("component failed to shut down cleanly", where=where, error=str(error))
                self.report_status(where, Status.STOPPED)
            self.telemetry.stop()

