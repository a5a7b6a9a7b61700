"""What the otlp_grpc and otlp_http exporters share: the queue and retry around one export call,
and the partial success a backend may answer with."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from pycollector.auth import ClientAuthenticator, authenticator
from pycollector.component import Component, PermanentError, Settings
from pycollector.exporterhelper.failure_log import FailureLog
from pycollector.exporterhelper.sender import QueuedRetryExporter, RetryableSendError
from pycollector.logs import log_once
from pycollector.otlp.profiles_wire import LAYOUTS, mismatch_hint
from pycollector.otlp.signals import rejected_count
from pycollector.pdata import signal_of


class OtlpExporter(Component):
    """Subclasses open and close their transport and make one export call.

    ``_export`` returns the backend's response, or raises RetryableSendError / PermanentError.
    """

    reports_sent_items = True  # the sending queue counts sent and failed items when sends end

    def __init__(self, settings: Settings, config: Any):
        """``config`` has the ``retry_on_failure`` and ``sending_queue`` sections and
        ``profiles_wire_version``."""
        self.log = settings.logger
        self.id = str(settings.id)
        self.config = config
        # The profiles.proto layout the backend reads; pipelines carry the current one.
        self.profiles_layout = LAYOUTS[config.profiles_wire_version]
        self._sender = QueuedRetryExporter(settings, config.retry_on_failure, config.sending_queue, self._send)
        self._partial_success = FailureLog(settings.logger)
        self.authenticator: ClientAuthenticator | None = None  # (auth: the credentials each request carries)

    def start(self, host: Any) -> None:
        self.authenticator = authenticator(host, getattr(self.config, "auth", None), ClientAuthenticator, f"exporters::{self.id}")
        self._open()
        self._sender.start(host)

    def consume(self, data: Any) -> None:
        self._sender.consume(data)

    def shutdown(self) -> None:
        self._sender.shutdown()
        self._close()
        self._partial_success.flush()

    def export_now(self, data: Any) -> None:
        """Send ``data`` in one call, past the queue and without retrying (the loadbalancing
        exporter's backends: it routes what one does not take to another). Raises
        RetryableSendError or PermanentError."""
        self._send(data)

    def _send(self, data: Any) -> None:
        signal = signal_of(data)
        try:
            response = self._export(signal, data)
        except (PermanentError, RetryableSendError) as error:
            if signal == "profiles":
                self._hint_at_layout(str(error))
            raise
        rejected, message = rejected_count(signal, response)
        if rejected or message:
            # The backend took the request but not all of it; retrying would not change that.
            self._partial_success.record("warning", "partial success: the backend rejected items", rejected, signal=signal, message=message)

    def _hint_at_layout(self, error: str) -> None:
        """A backend that reads another profiles.proto layout refuses with a tell-tale message:
        say once which setting fixes it."""
        suggested = mismatch_hint(error, self.profiles_layout)
        if suggested is not None:
            log_once(
                self.log,
                ("profiles_wire_version", self.id),
                "warning",
                f"the backend seems to read another profiles.proto layout than the v{self.profiles_layout.version} "
                f"sent: set profiles_wire_version: '{suggested}' on this exporter (the README's table says which backend reads which)",
                setting=f"exporters::{self.id}::profiles_wire_version",
                backend_said=error,
            )

    def _open(self) -> None:
        raise NotImplementedError

    def _export(self, signal: str, data: Any) -> Message:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError
