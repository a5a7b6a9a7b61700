"""Where the backends are: a static list, or a DNS name resolved every interval (A and AAAA, by
the system's resolver, as Go's net.Resolver: /etc/hosts, then the DNS servers /etc/resolv.conf
names). Each tells the exporter the sorted endpoints whenever they change. A lookup that fails or
takes longer than its timeout keeps the endpoints it had (counted, logged once in a row)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from exporters.loadbalancing.config import DnsResolverSettings, StaticResolverSettings

Listener = Callable[[list[str]], None]


class StaticResolver:
    name = "static"

    def __init__(self, settings: StaticResolverSettings, changed: Listener, telemetry: Any, logger: Any) -> None:
        self.endpoints = sorted(set(settings.hostnames))
        self._changed = changed
        telemetry.resolutions.labels(resolver=self.name, success="true").inc()

    def start(self) -> None:
        self._changed(self.endpoints)

    def stop(self) -> None:
        pass


class DnsResolver:
    name = "dns"

    def __init__(self, settings: DnsResolverSettings, changed: Listener, telemetry: Any, logger: Any) -> None:
        self.settings = settings
        self.endpoints: list[str] = []
        self._changed = changed
        self._telemetry = telemetry
        self.log = logger
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._lookup: threading.Thread | None = None

    def start(self) -> None:
        """Resolve once now (a failure is logged: the backends come with a later lookup), then
        every interval on a thread of its own."""
        self.resolve()
        self._thread = threading.Thread(target=self._every_interval, name="loadbalancing-dns", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _every_interval(self) -> None:
        while not self._stop.wait(self.settings.interval):
            self.resolve()

    def resolve(self) -> None:
        found = self._lookup_within_timeout()
        self._telemetry.resolutions.labels(resolver=self.name, success=str(found is not None).lower()).inc()
        if found is None:
            return
        port = self.settings.port
        endpoints = sorted({(f"[{address}]" if ":" in address else address) + (f":{port}" if port else "") for address in found})
        if endpoints != self.endpoints:
            self.endpoints = endpoints
            self._changed(endpoints)

    def _lookup_within_timeout(self) -> list[str] | None:
        """The addresses the name has; None when the lookup failed or took over its timeout (a
        lookup still running is waited for by the next interval's, not started again)."""
        if self._lookup is not None and self._lookup.is_alive():
            return self._failed("the previous lookup has not returned yet")
        answer: dict[str, Any] = {}

        def look_up() -> None:
            try:
                answer["addresses"] = [info[4][0] for info in socket.getaddrinfo(self.settings.hostname, None, type=socket.SOCK_STREAM)]
            except OSError as error:
                answer["error"] = error

        self._lookup = threading.Thread(target=look_up, name="loadbalancing-dns-lookup", daemon=True)
        self._lookup.start()
        self._lookup.join(self.settings.timeout)
        if self._lookup.is_alive():
            return self._failed(f"no answer within {self.settings.timeout} s")
        if "error" in answer:
            return self._failed(str(answer["error"]))
        if self._failing:
            self.log.info("loadbalancing: the backends' name resolves again", hostname=self.settings.hostname)
        self._failing = False
        return answer["addresses"]

    def _failed(self, reason: str) -> None:
        if not self._failing:
            self.log.warning("loadbalancing: the backends' name did not resolve; the backends stay as they were",
                             hostname=self.settings.hostname, reason=reason, backends=self.endpoints)
        self._failing = True
        return None
