"""OTLP/gRPC: the Export service of each signal some pipeline takes; other services are UNIMPLEMENTED."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Callable, Iterable

import grpc

from pycollector.auth import Unauthenticated
from pycollector.client import ClientInfo, address_from_grpc_peer, metadata_from_pairs
from pycollector.component import StartError
from pycollector.config.servers import grpc_buffer_options, grpc_keepalive_options
from pycollector.http_server import split_endpoint
from pycollector.otlp import ENCODINGS, OTLP_SIGNALS, OtlpSignal
from pycollector.otlp.rpc_status import DETAILS_TRAILER

from receivers.otlp.auth_gate import AuthGate
from receivers.otlp.config import GrpcServerSettings
from receivers.otlp.decoding import RequestDecoder
from receivers.otlp.delivery import Rejection, undecodable

# Threads answering RPCs; each one blocks while its request goes through the pipeline, so this
# bounds the requests in flight. More wait in gRPC's queue.
WORKER_THREADS = 16
MIB = 1 << 20


class OtlpGrpcServer:
    def __init__(self, settings: GrpcServerSettings, signals: Iterable[str], decoder: RequestDecoder, deliver: Callable[..., Rejection | None],
                 shared_port: bool = False):
        self.settings = settings
        self.shared_port = shared_port
        self.signals = sorted(signals)
        self._decoder = decoder
        self._deliver = deliver
        self._server: grpc.Server | None = None
        self.gate: AuthGate | None = None  # who may send (auth), set before start

    def start(self) -> tuple[str, int]:
        """Listen and serve; returns the bound (host, port), port 0 in the config being resolved."""
        settings = self.settings
        # A port in use must fail here, not be shared, unless the collector's own workers share it.
        options = [("grpc.so_reuseport", int(self.shared_port))]
        if settings.max_recv_msg_size_mib:
            options.append(("grpc.max_receive_message_length", settings.max_recv_msg_size_mib * MIB))
        if settings.max_concurrent_streams:
            options.append(("grpc.max_concurrent_streams", settings.max_concurrent_streams))
        options += grpc_buffer_options(settings.read_buffer_size, settings.write_buffer_size)
        options += grpc_keepalive_options(settings.keepalive)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="otlp-grpc"), options=options)
        for signal in self.signals:
            otlp = OTLP_SIGNALS[signal]
            server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(otlp.service, {"Export": self._export_handler(otlp)})])
        endpoint = self.settings.endpoint
        address = f"unix:{endpoint}" if self.settings.transport == "unix" else endpoint
        try:
            port = server.add_secure_port(address, self._credentials()) if self.settings.tls else server.add_insecure_port(address)
        except RuntimeError as error:
            port, reason = 0, str(error)
        else:
            reason = "the address is in use or cannot be bound"
        if not port:
            raise StartError(f"protocols::grpc::endpoint: cannot listen on {endpoint}: {reason}")
        server.start()
        self._server = server
        return (endpoint, 0) if self.settings.transport == "unix" else (split_endpoint(endpoint)[0], port)

    def stop(self, grace: float) -> None:
        """Refuse new RPCs, let those in flight finish for up to ``grace`` seconds."""
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def _credentials(self) -> grpc.ServerCredentials:
        tls = self.settings.tls
        try:
            key, cert = tls.key(), tls.certificate()
            client_ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
        except OSError as error:
            raise StartError(f"protocols::grpc::tls: cannot read {error.filename}: {error.strerror}") from error
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None)

    def _client(self, context: grpc.ServicerContext) -> ClientInfo:
        """Who sent the request; aborts the call with UNAUTHENTICATED when its gate refuses it."""
        address = address_from_grpc_peer(context.peer())
        metadata = metadata_from_pairs(context.invocation_metadata()) if self.settings.include_metadata or self.gate else {}
        auth = {}
        if self.gate is not None:
            try:
                auth = self.gate.admit(metadata, address)
            except Unauthenticated as refusal:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, str(refusal))
        return ClientInfo(address, metadata if self.settings.include_metadata else {}, auth)

    def _export_handler(self, otlp: OtlpSignal) -> grpc.RpcMethodHandler:
        def export(request: bytes, context: grpc.ServicerContext):
            client = self._client(context)  # (first: a request that may not come in is not decoded)
            # Decoded here rather than by gRPC, so a bad message is INVALID_ARGUMENT that says why.
            try:
                data = self._decoder.decode(otlp, request, ENCODINGS["proto"])
            except Exception as error:  # protobuf's DecodeError, or anything its parser raises
                rejection = undecodable(otlp.signal, error)
            else:
                rejection = self._deliver(data, client)
            if rejection is not None:
                if rejection.retry_after is not None:
                    context.set_trailing_metadata([(DETAILS_TRAILER, rejection.status().SerializeToString())])
                context.abort(rejection.grpc_code, rejection.message)
            return otlp.response_type()

        # Requests arrive as bytes (no deserializer) so decoding errors are ours to report.
        return grpc.unary_unary_rpc_method_handler(export, response_serializer=otlp.response_type.SerializeToString)
