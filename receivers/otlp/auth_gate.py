"""Who may send: each request's headers (gRPC metadata, HTTP headers) go to the authenticator the
protocol's ``auth`` names, before anything of the request is decoded. A refusal is counted
(``pycollector_receiver_unauthenticated_requests{transport}``) and logged at most once per
interval with a count (the reason, the client's address; never a credential), and the client
hears UNAUTHENTICATED (gRPC) or 401 (HTTP), which OTLP clients do not retry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pycollector.auth import ServerAuthenticator, Unauthenticated
from pycollector.exporterhelper.failure_log import FailureLog


class AuthGate:
    def __init__(self, authenticator: ServerAuthenticator, transport: str, refused: Any, logger: Any) -> None:
        """``refused``: the counter of refusals, its transport label still to set."""
        self.authenticator = authenticator
        self.transport = transport
        self._refused = refused.labels(transport=transport)
        self._failures = FailureLog(logger)

    def admit(self, headers: Mapping[str, Sequence[str]], address: str) -> dict[str, str]:
        """What the authenticator says of the client; raises Unauthenticated (counted, logged)."""
        try:
            return self.authenticator.authenticate(headers)
        except Unauthenticated as refusal:
            self._refused.inc()
            self._failures.record("warning", "a request was refused: its credentials are missing or wrong", 0,
                                  transport=self.transport, client=address, reason=str(refusal))
            raise

    def flush(self) -> None:
        self._failures.flush()
