"""The loadbalancing exporter: each resource's data to the backend its routing key hashes to
(ring.py), one otlp_grpc exporter a backend, the backends from a resolver (resolvers.py).

What a backend does not take (it went away, or refuses for now) is sent to the others at once:
that backend is left out of the ring for a while (BACKOFF_S, doubling to MAX_BACKOFF_S while it
keeps failing), so its keys go to their next place on the ring, and come back to it once it
takes data again. With no backend left, the data waits in the balancer's queue and is retried.
A key therefore stays on one backend while the backends stay up, as Go's does.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pycollector.component import Component, PermanentError, Settings
from pycollector.exporterhelper import QueuedRetryExporter, RetryableSendError

from exporters.loadbalancing.config import LoadBalancingConfig, StaticResolverSettings
from exporters.loadbalancing.resolvers import DnsResolver, StaticResolver
from exporters.loadbalancing.ring import Ring
from exporters.loadbalancing.routing import key_function, split

BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
# A backend's channel tries to connect again within this (gRPC's own backoff goes to 120 s): a
# gateway that is back gets its keys back in seconds, not minutes.
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 500), ("grpc.min_reconnect_backoff_ms", 500),
                     ("grpc.max_reconnect_backoff_ms", int(MAX_BACKOFF_S * 1000) // 4)]
_LATENCY_BUCKETS_MS = (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class _Telemetry:
    """The Go exporter's metrics (otelcol_loadbalancer_*)."""

    def __init__(self, telemetry: Any) -> None:
        self.resolutions = telemetry.counter("otelcol_loadbalancer_num_resolutions", "Number of times the resolver has triggered new resolutions.", ("resolver", "success"))
        self.backends = telemetry.gauge("otelcol_loadbalancer_num_backends", "Current number of backends in use.", ("resolver",))
        self.updates = telemetry.counter("otelcol_loadbalancer_num_backend_updates", "Number of times the list of backends was updated.", ("resolver",))
        self.latency = telemetry.histogram("otelcol_loadbalancer_backend_latency", "Response latency in ms for the backends.", ("endpoint",), buckets=_LATENCY_BUCKETS_MS)
        self.outcomes = telemetry.counter("otelcol_loadbalancer_backend_outcome", "Number of successes and failures for each endpoint.", ("endpoint", "success"))


class _Backend:
    """One backend: its exporter (no queue or retries of its own) and whether it takes data."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter
        self.down_until = 0.0
        self.backoff = BACKOFF_S


class LoadBalancingExporter(Component):
    def __init__(self, settings: Settings, config: LoadBalancingConfig, backend_factory: Any) -> None:
        self.log = settings.logger
        self.id = str(settings.id)
        self.config = config
        self._settings = settings
        self._backend_factory = backend_factory  # the otlp_grpc exporter's
        self._lock = threading.Lock()
        self._backends: dict[str, _Backend] = {}
        self._rings: dict[frozenset[str], Ring] = {}
        self._host: Any = None
        self._key_of = key_function(config.key(), config.routing_attributes)
        self.telemetry = _Telemetry(settings.telemetry)
        resolver = config.resolver
        if resolver.dns is not None:
            self.resolver = DnsResolver(resolver.dns, self._use, self.telemetry, self.log)
        elif resolver.k8s is not None:
            from exporters.loadbalancing.k8s_resolver import K8sResolver

            self.resolver = K8sResolver(resolver.k8s, self._use, self.telemetry, self.log)
        else:  # (the default config, which names no backend, has none)
            self.resolver = StaticResolver(resolver.static or StaticResolverSettings(), self._use, self.telemetry, self.log)
        self._sender = QueuedRetryExporter(settings, config.balancer_retry(), config.balancer_queue(), self._send)

    def start(self, host: Any) -> None:
        self._host = host
        self.resolver.start()
        self._sender.start(host)

    def consume(self, data: Any) -> None:
        self._sender.consume(data)

    def shutdown(self) -> None:
        self.resolver.stop()
        self._sender.shutdown()
        with self._lock:
            backends, self._backends = list(self._backends.values()), {}
        for backend in backends:
            backend.exporter.shutdown()

    # -- the backends -----------------------------------------------------------------------------

    def _use(self, endpoints: list[str]) -> None:
        """The resolver's endpoints: an exporter for each new one, the gone ones' shut down."""
        with self._lock:
            gone = [self._backends.pop(endpoint) for endpoint in list(self._backends) if endpoint not in endpoints]
            for endpoint in endpoints:
                if endpoint not in self._backends:
                    exporter = self._backend_factory.create(self._settings, self.config.backend(endpoint), None)
                    exporter.channel_options = RECONNECT_OPTIONS
                    exporter.start(self._host)
                    self._backends[endpoint] = _Backend(exporter)
            self._rings.clear()
        for backend in gone:
            backend.exporter.shutdown()  # (no queue of its own: nothing of it is left to send)
        self.telemetry.backends.labels(resolver=self.resolver.name).set(len(endpoints))
        self.telemetry.updates.labels(resolver=self.resolver.name).inc()
        self.log.info("loadbalancing: backends", backends=endpoints, resolver=self.resolver.name)

    def _ring(self) -> Ring:
        """The ring of the backends taking data now (one whose time out is over is tried again)."""
        now = time.monotonic()
        with self._lock:
            up = frozenset(endpoint for endpoint, backend in self._backends.items() if backend.down_until <= now)
            ring = self._rings.get(up)
            if ring is None:
                ring = self._rings[up] = Ring(list(up))
            return ring

    def _outcome(self, endpoint: str, took_s: float, success: bool) -> None:
        self.telemetry.latency.labels(endpoint=endpoint).observe(took_s * 1000)
        self.telemetry.outcomes.labels(endpoint=endpoint, success=str(success).lower()).inc()
        with self._lock:
            backend = self._backends.get(endpoint)
            if backend is None:
                return
            if success:
                backend.down_until, backend.backoff = 0.0, BACKOFF_S
                return
            backend.down_until = time.monotonic() + backend.backoff
            backend.backoff = min(MAX_BACKOFF_S, backend.backoff * 2)
            self._rings.clear()

    # -- sending (the balancer's queue consumers) ---------------------------------------------------

    def _send(self, data: Any) -> None:
        """Each part of ``data`` to its backend; a part a backend did not take goes round again to
        the backends left. Raises RetryableSendError when none is left, PermanentError for a part
        a backend will never take."""
        pending, refused = [data], []
        while pending:
            ring = self._ring()
            if not ring.endpoints:
                raise RetryableSendError("loadbalancing: no backend takes data now")
            for endpoint, part in split(pending.pop(), self._key_of, ring.endpoint_for).items():
                with self._lock:
                    backend = self._backends.get(endpoint)
                if backend is None:  # (gone since the ring was made)
                    pending.append(part)
                    continue
                started = time.monotonic()
                try:
                    backend.exporter.export_now(part)
                except RetryableSendError as error:
                    self._outcome(endpoint, time.monotonic() - started, False)
                    self.log.warning("loadbalancing: a backend did not take data; its keys go to the others for now",
                                     backend=endpoint, error=str(error))
                    pending.append(part)
                except PermanentError as error:
                    self._outcome(endpoint, time.monotonic() - started, False)
                    refused.append(f"{endpoint}: {error}")
                else:
                    self._outcome(endpoint, time.monotonic() - started, True)
        if refused:
            raise PermanentError("; ".join(refused))
