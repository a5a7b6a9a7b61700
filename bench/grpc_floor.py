"""The pipeline bench's second peer: a grpcio server that answers every OTLP profiles Export and
does nothing with the request, the most any gateway on Python's gRPC server can do per second.

``python -m bench.grpc_floor``: listens on 127.0.0.1 (a free port), prints the port, serves until
interrupted. Built as the otlp receiver's server is: 16 worker threads, requests as bytes."""

from __future__ import annotations

import signal
import sys
from concurrent import futures

import grpc
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

from bench.sink import SERVICE

WORKER_THREADS = 16  # as receivers/otlp/grpc_server.py


def main() -> int:
    answer = profiles_service_pb2.ExportProfilesServiceResponse()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKER_THREADS), options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 << 20)])
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: answer, response_serializer=profiles_service_pb2.ExportProfilesServiceResponse.SerializeToString)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Export": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
    server.stop(0).wait()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
