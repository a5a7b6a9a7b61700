"""What the otlp_grpc and otlp_http exporters share: the queue and retry around one export call,
and the partial success a backend may answer with."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from pycollector.component import Component, Settings
from pycollector.exporterhelper.failure_log import FailureLog
from pycollector.otlp.signals import rejected_count
from pycollector.exporterhelper.sender import QueuedRetryExporter
from pycollector.pdata import signal_of


class OtlpExporter(Component):
    """Subclasses open and close their transport and make one export call.

    ``_export`` returns the backend's response, or raises RetryableSendError / PermanentError.
    """

    reports_sent_items = True  # the sending queue counts sent and failed items when sends end

    def __init__(self, settings: Settings, config: Any):
        """``config`` has the ``retry_on_failure`` and ``sending_queue`` sections."""
        self.log = settings.logger
        self.config = config
        self._sender = QueuedRetryExporter(settings, config.retry_on_failure, config.sending_queue, self._send)
        self._partial_success = FailureLog(settings.logger)

    def start(self, host: Any) -> None:
        self._open()
        self._sender.start()

    def consume(self, data: Any) -> None:
        self._sender.consume(data)

    def shutdown(self) -> None:
        self._sender.shutdown()
        self._close()
        self._partial_success.flush()

    def _send(self, data: Any) -> None:
        signal = signal_of(data)
        rejected, message = rejected_count(signal, self._export(signal, data))
        if rejected or message:
            # The backend took the request but not all of it; retrying would not change that.
            self._partial_success.record("warning", "partial success: the backend rejected items", rejected, signal=signal, message=message)

    def _open(self) -> None:
        raise NotImplementedError

    def _export(self, signal: str, data: Any) -> Message:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError
