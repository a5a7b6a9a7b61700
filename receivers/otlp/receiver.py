"""The otlp receiver: runs the gRPC and HTTP servers its config turns on.

It serves only the signals some pipeline takes from it (its next consumer says which), as the Go
receiver registers only the services of the pipelines it was created for: a client sending another
signal hears UNIMPLEMENTED (gRPC) or 404 (HTTP) instead of having its data dropped.
"""

from __future__ import annotations

from typing import Any

from pycollector.auth import ServerAuthenticator, authenticator
from pycollector.component import Component, Consumer, Settings

from receivers.otlp.auth_gate import AuthGate
from receivers.otlp.config import OtlpReceiverConfig
from receivers.otlp.decoding import RequestDecoder
from receivers.otlp.delivery import Delivery
from receivers.otlp.grpc_server import OtlpGrpcServer
from receivers.otlp.http_server import OtlpHttpServer

# How long a stopping receiver lets requests in flight finish; the pipeline behind it still runs.
SHUTDOWN_GRACE = 5.0


class OtlpReceiver(Component):
    def __init__(self, settings: Settings, config: OtlpReceiverConfig, next_consumer: Consumer, signals: frozenset[str]):
        self.log = settings.logger
        self.id = str(settings.id)
        self.config = config
        served = getattr(next_consumer, "signals", None)
        self.signals = signals if served is None else signals & frozenset(served)
        self._delivery = Delivery(next_consumer, settings.logger)
        decoder = RequestDecoder(self.id, config.profiles_wire_version, settings.logger)
        protocols = config.protocols
        self._servers: list[Any] = []
        # Worker processes of one collector share the ports; a lone collector's port in use is an error.
        shared = settings.worker.shared
        self.grpc = OtlpGrpcServer(protocols.grpc, self.signals, decoder, self._delivery, shared) if protocols.grpc else None
        self.http = OtlpHttpServer(protocols.http, self.signals, decoder, self._delivery, shared) if protocols.http else None
        # Bound (host, port) of each server once started: with port 0 in the config, the real one.
        self.grpc_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self._refused = settings.telemetry.counter("pycollector_receiver_unauthenticated_requests",
                                                   "Requests refused because their credentials were missing or wrong (auth).", ("transport",))
        self._gates: list[AuthGate] = []

    def start(self, host: Any) -> None:
        for transport, server in (("grpc", self.grpc), ("http", self.http)):
            if server is not None:
                found = authenticator(host, server.settings.auth, ServerAuthenticator, f"receivers::{self.id}::protocols::{transport}")
                server.gate = AuthGate(found, transport, self._refused, self.log) if found is not None else None
                self._gates += [server.gate] if server.gate is not None else []
        try:
            if self.grpc is not None:
                self.grpc_address = self.grpc.start()
                self._servers.append(self.grpc)
            if self.http is not None:
                self.http_address = self.http.start()
                self._servers.append(self.http)
        except Exception:
            self.shutdown()
            raise
        self.log.info("otlp receiver listening", grpc=_show(self.grpc_address), http=_show(self.http_address), signals=",".join(sorted(self.signals)))

    def shutdown(self) -> None:
        while self._servers:
            self._servers.pop().stop(SHUTDOWN_GRACE)
        self._delivery.flush()
        for gate in self._gates:
            gate.flush()


def _show(address: tuple[str, int] | None) -> str:
    return f"{address[0]}:{address[1]}" if address else "off"
