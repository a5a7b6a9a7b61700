"""The otlp_grpc exporter: one channel, one Export call per queued message.

A failed call is retried when its status says the backend may take the data later, as the Go
exporter decides: UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED, OUT_OF_RANGE, DATA_LOSS, and
RESOURCE_EXHAUSTED only when the server attached a RetryInfo (without one, it means the request
itself is too large and never will fit). A RetryInfo delay is waited for. Any other status drops
the data.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message import Message

from pycollector.component import PermanentError, Settings, StartError
from pycollector.config.types import reveal_headers
from pycollector.exporterhelper import RetryableSendError
from pycollector.otlp import OTLP_SIGNALS, profiles_wire, retry_delay, status_from_trailers
from pycollector.exporterhelper.otlp_exporter import OtlpExporter

from exporters.otlp_grpc.config import OtlpGrpcConfig

RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.DATA_LOSS,
    }
)
_COMPRESSION = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}


class OtlpGrpcExporter(OtlpExporter):
    config: OtlpGrpcConfig

    def __init__(self, settings: Settings, config: OtlpGrpcConfig):
        super().__init__(settings, config)
        self._channel: grpc.Channel | None = None
        self._calls: dict[str, Any] = {}
        self._metadata = tuple((key.lower(), value) for key, value in reveal_headers(config.headers).items())
        # gRPC channel arguments beyond the config's (the loadbalancing exporter's: reconnect soon).
        self.channel_options: list[tuple[str, int]] = []

    def _open(self) -> None:
        config = self.config
        options = config.grpc_options() + self.channel_options
        compression = _COMPRESSION.get(config.compression, grpc.Compression.NoCompression)
        if self.authenticator is not None and not config.uses_tls():
            # As gRPC's per-call credentials in Go (RequireTransportSecurity): never in the clear.
            raise StartError(f"exporters::{self.id}::auth: {config.auth.authenticator} gives credentials, which are sent only over "
                             "TLS, and this exporter sends in plain text (tls::insecure: true)")
        if config.uses_tls():
            files = config.tls.read_files()
            credentials = grpc.ssl_channel_credentials(root_certificates=files.ca, private_key=files.key, certificate_chain=files.cert)
            self._channel = grpc.secure_channel(config.target(), credentials, options=options, compression=compression)
        else:
            self._channel = grpc.insecure_channel(config.target(), options=options, compression=compression)
        self._calls = {
            signal: self._channel.unary_unary(otlp.grpc_method, request_serializer=self._serializer(signal), response_deserializer=otlp.response_type.FromString)
            for signal, otlp in OTLP_SIGNALS.items()
        }

    def _serializer(self, signal: str):
        # A *Data message has the wire form of its Export request: sent as is, profiles in the
        # layout the backend reads.
        if signal == "profiles":
            layout = self.profiles_layout
            return lambda data: profiles_wire.encode(data, "proto", layout)
        return _serialize

    def _export(self, signal: str, data: Any) -> Message:
        try:
            metadata = self._metadata
            if self.authenticator is not None:  # (asked at each call: credentials from a file may change)
                metadata += tuple((key.lower(), value) for key, value in self.authenticator.credentials().items())
            return self._calls[signal](data, timeout=self.config.timeout or None, metadata=metadata, wait_for_ready=self.config.wait_for_ready)
        except grpc.RpcError as error:
            raise _classify(error) from None

    def _close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _serialize(data: Message) -> bytes:
    return data.SerializeToString()


def _classify(error: grpc.RpcError) -> Exception:
    code, details = error.code(), error.details()
    status = status_from_trailers(error.trailing_metadata())
    delay = retry_delay(status) if status is not None else None
    message = f"{code.name}: {details}"
    if code in RETRYABLE_CODES or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None):
        return RetryableSendError(message, retry_after=delay)
    return PermanentError(message)
