"""The health_check extension: answers 200 with a JSON body on ``endpoint`` + ``path`` while every
pipeline runs, and 503 naming the component that failed (or is still starting) otherwise. Load
balancers and Kubernetes probes point here, as at the Go collector's health_check."""

from __future__ import annotations

import json

from pycollector.component import Component

from extensions.health_check.config import HealthCheckConfig
from extensions.health_check.status import StatusBoard
from pycollector.http_server import HttpEndpoint, Response, server_tls_context


class HealthCheckExtension(Component):
    def __init__(self, settings, config: HealthCheckConfig):
        self.log = settings.logger
        self.config = config
        self.board = StatusBoard()
        self._server: HttpEndpoint | None = None
        self.url: str | None = None

    def start(self, host) -> None:
        tls = server_tls_context(self.config.tls, "tls") if self.config.tls is not None else None
        self._server = HttpEndpoint(self.config.endpoint, self._answer, thread_name="health-check-http", tls=tls,
                                    keep_alive=self.config.keep_alives_enabled)
        self.url = self._server.start() + self.config.path
        self.log.info("health check", url=self.url)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.stop()

    def on_component_status(self, source: str, status: str, error: BaseException | None) -> None:
        """Called by the service for every component's status change (and by components through
        ``host.report_status``)."""
        self.board.update(source, status, error)

    def _answer(self, path: str) -> Response:
        # As Go's route: "/" answers every path, any other only its own.
        if self.config.path != "/" and path != self.config.path:
            return Response(404, json.dumps({"error": f"not found; health is at {self.config.path}"}).encode())
        healthy, body = self.board.health()
        status = 200 if healthy else 503
        plain = self.config.response_body
        if plain is not None:
            return Response(status, (plain.healthy if healthy else plain.unhealthy).encode(), "text/plain; charset=utf-8")
        return Response(status, json.dumps(body).encode())
